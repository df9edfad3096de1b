# sft_grid: set up this machine, run the demo grid, run the tests.
#   make demo   set up, then train the README's grid (two tiny models, LLaMA-Factory, CPU)
#   make test   set up, start the local Slurm cluster, then run the whole test suite (real training included)
#   make slurm-up / slurm-down   start / stop a real two-node Slurm cluster on this machine (root, Debian)
# Backend environments and tiny assets go to $SFT_GRID_CACHE (default ~/.cache/sft_grid), keyed by
# their pins: a second `make` reuses them.
PYTHON ?= python3

.PHONY: setup demo test slurm-up slurm-down

setup:
	$(PYTHON) -m pip install -q -e '.[test]' --config-settings editable_mode=compat
	$(PYTHON) -m sft_grid.env build llamafactory
	$(PYTHON) -m sft_grid.env build axolotl
	$(PYTHON) -m sft_grid.assets build

demo: setup
	$(PYTHON) -m sft_grid -m model=tiny_llama,tiny_qwen3 lr=2e-5

test: setup slurm-up
	$(PYTHON) -m pytest -q

slurm-up:
	bash scripts/slurm_up.sh

slurm-down:
	bash scripts/slurm_down.sh
