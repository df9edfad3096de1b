"""The shipped sites as their GPUs run them (sft_grid/planning/gpus.py): every GPU site states its GPU's memory and its
network, and the cells the team trains there, Qwen3-8B and Qwen3-32B at 32k tokens and the largest Delphi at 4k,
with either backend, get a layout that fits by the model (no cell is refused, none out of memory at step 0)."""

from __future__ import annotations

import pytest

from sft_grid.planning.gpus import GIB
from sft_grid.planning.validate import gpu_fit

from .conftest import hydra_plain
from .test_clusters import SITES
from .test_gpus import DELPHI_1E22
from .test_shipped_configs import set_user_env

CELLS = {
    "qwen3_8b@32k": ["model=qwen3_8b", "cutoff_len=32768"],
    "qwen3_32b@32k": ["model=qwen3_32b", "cutoff_len=32768"],
    "delphi_1e22@4k": [*DELPHI_1E22, "model.num_kv_heads=30"],
}


@pytest.mark.parametrize("site", SITES)
def test_every_gpu_site_states_its_gpus_memory_and_network(hydra_loader, monkeypatch, site):
    set_user_env(monkeypatch, "cluster", site)
    c = hydra_plain([f"cluster={site}"])["cluster"]
    assert c["gpus_per_node"] > 0 and c["gpu_mem_gb"] >= 40
    # the network where the site documents it (the others say in their comment that it is not known)
    assert (c["internode_gbps"] or 0) > 0 or site in ("capella", "empireai", "jureca", "vista")


@pytest.mark.parametrize("backend", ["llamafactory", "axolotl"])
@pytest.mark.parametrize("what", sorted(CELLS))
@pytest.mark.parametrize("site", SITES)
def test_the_teams_cells_fit_on_every_shipped_site_or_are_refused_with_the_fix_that_fits(
    make_cells, monkeypatch, site, what, backend
):
    """Each cell fits by the model, or it is refused before anything is queued with a fix that makes it fit, and that
    fix does: Qwen3 at 32k where the site's environment has no fused loss (the logits of 32,768 x 151,936 alone are
    50 GB) is told to use Liger; Qwen3-32B on 40 GB A100s, where even one checkpointed 32k sequence does not fit, a
    shorter cutoff."""
    set_user_env(monkeypatch, "cluster", site)
    base = [f"cluster={site}", f"backend={backend}", "global_batch_size=32", *CELLS[what]]
    (cell,) = make_cells(base)
    lay = cell.layout
    assert lay.memory is not None and lay.gpu_mem_gb
    problems = [p for p in gpu_fit(cell) if p.rule == "gpu-memory"]
    if lay.fits:
        assert lay.memory.total <= 0.95 * lay.gpu_mem_gb * GIB and not problems
    else:
        assert [p.cell for p in problems] == [cell.name]
        first = problems[0].fix.split("; or ")[0].split(" (")[0]
        applied = ["cluster.kernels=[liger_kernel]"] if first == "layout.liger=true" else [first]
        assert first == "layout.liger=true" or first.startswith("cutoff_len="), problems[0].fix
        (cell,) = make_cells([*base, *applied])
        lay = cell.layout
        assert lay.fits, (site, what, backend, first, lay.summary(), lay.memory)
    if what.endswith("@32k"):
        # 32k tokens of activations: checkpointing on, whichever backend (axolotl's default was off)
        assert lay.checkpointing
    assert 32 % (lay.world * cell.spec.micro_batch_size) == 0  # the global batch stays divisible
