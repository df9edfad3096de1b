"""cell.yaml read back by its one reader (sft_grid/core/cellfiles.CellYaml), and the schema's sections shared by
value (sft_grid/core/schema.typed, fingerprint): a rendered cell.yaml from the golden set, read as data and as the
schema's types."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import yaml

from sft_grid.core.cellfiles import CellYaml
from sft_grid.core.layout import CELL_FILE
from sft_grid.core.schema import BackendConf, CellConf, ClusterConf, DatasetConf, fingerprint, typed

GOLDEN = Path(__file__).resolve().parent / "golden" / "tiny_llama_sharegpt"


@pytest.fixture
def cell_dir(tmp_path: Path) -> Path:
    shutil.copy(GOLDEN / CELL_FILE, tmp_path / CELL_FILE)
    return tmp_path


def test_cell_yaml_reads_as_data_and_as_the_schema(cell_dir: Path):
    whole = CellYaml.load(cell_dir)
    assert whole.config == yaml.safe_load((cell_dir / CELL_FILE).read_text())
    assert whole.text.startswith("# sft_grid cell ")
    spec = whole.spec
    assert (
        isinstance(spec, CellConf) and isinstance(spec.cluster, ClusterConf) and isinstance(spec.backend, BackendConf)
    )
    assert spec.backend.name == "llamafactory" and spec.model.name == "tiny_llama"
    assert all(isinstance(d, DatasetConf) for d in spec.dataset.values())


def test_cell_yaml_builds_only_the_keys_asked_for(cell_dir: Path):
    part = CellYaml.load(cell_dir, ("backend", "nodes"))
    assert set(part.config) == {"backend", "nodes"}
    assert part.spec.backend.name == "llamafactory"


def test_an_unreadable_cell_yaml_is_an_error_or_an_empty_config(cell_dir: Path, tmp_path: Path):
    (cell_dir / CELL_FILE).write_text("- a list\n- not a config\n")
    with pytest.raises(ValueError, match="holds no mapping"):
        CellYaml.load(cell_dir)
    (cell_dir / CELL_FILE).write_text("cluster: {name: [unclosed\n")
    with pytest.raises(ValueError, match="is not YAML"):
        CellYaml.load(cell_dir)
    assert CellYaml.config_of(cell_dir) == {}
    assert CellYaml.config_of(tmp_path / "no-such-cell") == {}


def test_equal_sections_are_one_typed_object_keyed_by_value_not_identity(cell_dir: Path):
    data = CellYaml.load(cell_dir).config
    # two separately parsed copies: equal values, different dicts (an id()-keyed cache could not share them)
    a, b = typed(CellConf, data), typed(CellConf, yaml.safe_load((cell_dir / CELL_FILE).read_text()))
    assert a.cluster is b.cluster and a.backend is b.backend and fingerprint(a.cluster) == fingerprint(b.cluster)
    # a different value is another object, with another key
    changed = {**data, "cluster": {**data["cluster"], "cpus_per_node": 3}}
    c = typed(CellConf, changed)
    assert c.cluster is not a.cluster and fingerprint(c.cluster) != fingerprint(a.cluster)
    # 1 and 1.0 and "1" stay apart
    assert fingerprint({"x": 1}) != fingerprint({"x": 1.0}) != fingerprint({"x": "1"})
    # the key kept on a section is not one of its fields: what serialises a section never sees it
    assert "_sft_grid_fingerprint" not in dataclasses.asdict(a.cluster)
