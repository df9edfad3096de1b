# sft_grid: set up this machine, run the demo grid, run the tests.
#   make demo   set up what the demo needs, then train the README's grid (two tiny models, LLaMA-Factory, CPU)
#   make test   set up everything the tests need (both backends, the evaluation harness, the local Slurm cluster),
#               then run them all
#   make check  the static checks (ruff, mypy): seconds; make test runs them first
#   make test-fast   the fast set: no backend, no Slurm; builds only what its dry runs read: LLaMA-Factory's and
#                    lm-eval's environments and the tiny assets (~4 minutes on 2 cores)
#   make slurm-up / slurm-down   start / stop a real two-node Slurm cluster on this machine (root, Debian)
#   make slurm-site-up / slurm-site-down   a second one beside it (siteb, one node), for the remote-site tests
# Virtual environments and tiny assets go to $SFT_GRID_CACHE (default ~/.cache/sft_grid), keyed by their
# pins: a second `make` reuses them.
PYTHON ?= python3

.PHONY: install lock check setup-demo setup chromium nginx sshd demo test test-fast gpu-wheels slurm-up slurm-down slurm-site-up\
	slurm-site-down

# sft_grid itself, its tests' and checks' tools, exactly as requirements.lock has them (pyproject.toml: the ranges);
# then sft_grid's own bytecode: where PYTHONDONTWRITEBYTECODE=1 is set (CI) every command and every job would
# otherwise compile the modules it imports (~0.1 s of CPU each)
install:
	$(PYTHON) -m pip install -q -c requirements.lock -e '.[test]' --config-settings editable_mode=compat
	$(PYTHON) -m compileall -q --invalidation-mode timestamp sft_grid hydra_plugins >/dev/null

# write requirements.lock afresh: what '.[test]' resolves to today, in a new environment
lock:
	rm -rf .lock-env && $(PYTHON) -m venv .lock-env && .lock-env/bin/pip install -q -e '.[test]' \
	  && (head -n 2 requirements.lock && .lock-env/bin/pip freeze --exclude-editable | grep -v '^sft.grid') > requirements.lock.new \
	  && mv requirements.lock.new requirements.lock; rm -rf .lock-env

# what `make demo` needs: LLaMA-Factory's environment (it also builds the tiny models) and the tiny assets
setup-demo: install
	$(PYTHON) -m sft_grid venv build llamafactory
	$(PYTHON) -m sft_grid assets build

# what the tests need besides: axolotl's environment, the evaluation harness's (lm-eval), and headless Chromium
# for the report's browser tests; the three environments are built side by side (pip waits on downloads and
# disks as much as on the CPU), each from its lock (conf/locks)
setup: install chromium nginx sshd
	$(PYTHON) -m sft_grid venv build llamafactory axolotl lm_eval
	$(PYTHON) -m sft_grid assets build

# Debian's Chromium (root): the report page is opened in it, offline, by tests/test_report_browser.py
chromium:
	command -v chromium >/dev/null || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium)

# Debian's nginx (root): the staging tests put it in front of the loopback hub (tests/test_stage_proxy.py); the tests
# start their own nginx processes, so the package's own service is left as it is
nginx:
	command -v nginx >/dev/null || test -x /usr/sbin/nginx || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y nginx)

# Debian's OpenSSH server (root): the remote-site tests (tests/test_sites_remote.py, marker `sites`) start their own
# sshd on a loopback port with a generated key; the package's own service is never started (policy-rc.d forbids it
# during the install when none is in place, as scripts/slurm_up.sh does)
sshd:
	test -x /usr/sbin/sshd || (apt-get update && if [ -e /usr/sbin/policy-rc.d ]; then \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openssh-server; else \
	  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openssh-server; \
	  rc=$$?; rm -f /usr/sbin/policy-rc.d; exit $$rc; fi)

demo: setup-demo
	$(PYTHON) -m sft_grid -m model=tiny_llama,tiny_qwen3 lr=2e-5

# the cheap answers first, in seconds: ruff's linter and formatter, mypy (their settings: pyproject.toml)
check: install
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	$(PYTHON) -m mypy

# The backend/Slurm set runs on two workers and shares the local cluster between them (tests that take the whole
# cluster hold it alone: tests/conftest.py); it names each test as a worker ends it (CI's log stamps each line with
# the time: which worker waited, and on what) and prints every test (and setup) of 20 s or more: the long poles of
# CI's time. Three workers were measured from a fresh clone (tests/README.md): no faster.
# The fast set runs beside it, at nice 10: the backend/Slurm set leaves a core idle for minutes while a worker waits
# on Slurm (a time limit's legs, a node's loss, a stopped controller; vmstat: 12-17% of the set idle), and the fast
# set, pure CPU, fills that time instead of running before it; at nice 10 it takes little from a busy core. Its
# output is printed once both end. It reads the tiny assets (its dry runs check that a cell's model and data paths
# exist) and lm-eval's environment (the dry runs of evaluated cells), so `make test-fast` builds those first.
FAST = not backend and not slurm and not mirror and not proxy and not sites
test: check setup slurm-up slurm-site-up
	@d=$$(mktemp -d); \
	(nice -n 10 $(PYTHON) -m pytest -q -n 2 -p no:cacheprovider --basetemp=$$d/tmp -m "$(FAST)" >$$d/log 2>&1; \
	 echo $$? >$$d/rc; date +"the fast set ended at %T" >>$$d/log) & \
	$(PYTHON) -m pytest -v -n 2 --dist loadgroup --no-loadscope-reorder -m "not ($(FAST))" --durations=0 --durations-min=20; \
	b=$$?; wait; echo "the fast set, run beside it at nice 10:"; cat $$d/log; f=$$(cat $$d/rc); rm -rf $$d; \
	test $$b -eq 0 && test $$f -eq 0

test-fast: install
	$(PYTHON) -m sft_grid venv build llamafactory lm_eval
	$(PYTHON) -m sft_grid assets build
	$(PYTHON) -m pytest -q -n 2 -m "$(FAST)"

# the wheels benchmarks/gpu_check.sh installs on a GPU machine whose python3 (GPU_PY, default 3.12) has a CUDA torch,
# triton, numpy, pandas, pyarrow and the rest of a usual CUDA image, but nothing can be fetched: LLaMA-Factory and what
# it needs at the managed environment's pins (conf/locks/llamafactory.txt), sft_grid's own (requirements.lock; antlr4's
# runtime is an sdist, built here) and liger-kernel; into .whl/ (git ignores it: add /.whl/ to .git/info/exclude)
GPU_PY ?= 3.12
GPU_WHEELS = llamafactory transformers tokenizers datasets dill multiprocess fsspec trl peft accelerate omegaconf \
	pydantic pydantic_core annotated-types typing-inspection typing_extensions
gpu-wheels:
	mkdir -p .whl && $(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version $(GPU_PY) \
	  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl \
	  $$(for p in $(GPU_WHEELS); do grep -i "^$$p==" sft_grid/conf/locks/llamafactory.txt; done) \
	  $$(grep -E "^(hydra-core|submitit)==" requirements.lock) liger-kernel==0.8.5
	$(PYTHON) -m pip wheel -q --no-deps -w .whl $$(grep "^antlr4-python3-runtime==" requirements.lock)

slurm-up:
	bash scripts/slurm_up.sh

# siteb first: it runs on ci's munged and slurmdbd (left running without them, its node stops answering)
slurm-down:
	bash scripts/slurm_site_down.sh
	bash scripts/slurm_down.sh

# a second cluster beside it (siteb: its own controller, ports, state and node; ci's accounting), for the tests of
# remote sites and grids across sites (tests/test_sites_remote.py); needs slurm-up
slurm-site-up: slurm-up
	bash scripts/slurm_site_up.sh

slurm-site-down:
	bash scripts/slurm_site_down.sh
