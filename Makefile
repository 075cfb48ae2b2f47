# The two commands of the README: `make demo` and `make test`.
PY := .venv/bin/python
HOSTS ?= 3
# the simulated fleets `make e2e` runs on at once, one pytest-xdist worker each ("default": `python -m sim`'s)
E2E_FLEETS ?= default,b,c
comma := ,

.PHONY: venv demo test fast unit unit-offline install-check e2e e2e-only down

venv:
	@bash scripts/venv.sh

## Converge three simulated Sparks for real, verify them, show them; Open WebUI's image builds meanwhile.
demo: venv
	@bash sim/bootstrap.sh
	$(PY) -m sim chat-ui --background
	$(PY) -m sim up --hosts $(HOSTS) --service-hosts 2
	.venv/bin/pyinfra -y inventory/sim.py deploy.py
	$(PY) -m sparkfleet doctor inventory/sim.py
	$(PY) -m pytest tests/infra --inventory inventory/sim.py -q -p no:cacheprovider
	$(PY) -m sparkfleet status inventory/sim.py --chat
	$(PY) -m sim chat-ui
	.venv/bin/pyinfra -y inventory/sim_chat_ui.py deploy.py
	$(PY) -m pytest tests/infra --inventory inventory/sim_chat_ui.py --limit front_door -q -p no:cacheprovider
	$(PY) -m pytest tests/infra/test_chat_ui.py --inventory inventory/sim_chat_ui.py --limit chat_ui -q -p no:cacheprovider
	$(PY) -m tools.bench_front_door inventory/sim_chat_ui.py --chat
	@echo "Colleagues sign in at $$($(PY) -m sim sign-in-url) with their own key (demo's: demo-user-key-0123456789)"

## What CI runs (scripts/test.sh): ruff and mypy, then the simulator's tests and the end-to-end tests on the simulated
## fleets and, beside them, the unit tests (the fast lane, then the tests that run a program of this machine:
## HAProxy, Prometheus, the node exporter, Chromium, restic: tests/tiers.py).
test: venv
	@bash scripts/test.sh

## The fast lane (within 3 minutes on 2 cores, nothing to install): ruff (pyproject.toml [tool.ruff]), mypy on
## contract/, release/, model/ ([tool.mypy]), and the unit tests of no tier (`--lane fast`: no program of this machine).
fast: venv
	.venv/bin/ruff check sparkfleet files tools
	.venv/bin/mypy
	$(PY) -m pytest tests/unit -n 2 -q -p no:cacheprovider --lane fast

## Two workers (pytest-xdist): the tests wait on their loopback servers and subprocesses as much as they compute.
unit: venv
	$(PY) -m pytest tests/unit -n 2 -q -p no:cacheprovider

## The unit suite with no network but loopback (a fresh network namespace): it must pass the same.
unit-offline: venv
	unshare -rn sh -c 'ip link set lo up && exec $(PY) -m pytest tests/unit -n 2 -q -p no:cacheprovider'

## `pip install .` into a fresh venv: the `sparkfleet` command, the stages and examples/my_deploy.py.
install-check: venv
	$(PY) -m pytest tests/e2e/test_install.py -q -p no:cacheprovider

## The e2e modules split between the fleets of E2E_FLEETS (each worker brings its own up), images built once first;
## the extra fleets are taken down after, the default one is left as the tests left it.
e2e: venv
	@bash sim/bootstrap.sh
	$(PY) -m sim build
	@$(MAKE) --no-print-directory e2e-only

## The e2e modules alone, the images built and dockerd started (scripts/test.sh runs it, the unit tests beside).
e2e-only:
	SPARKFLEET_E2E_FLEETS=$(E2E_FLEETS) $(PY) -m pytest tests/e2e -v --durations=15 -p no:cacheprovider \
		-n $(words $(subst $(comma), ,$(E2E_FLEETS))) --dist loadfile --no-loadscope-reorder; rc=$$?; \
	for f in $(filter-out default,$(subst $(comma), ,$(E2E_FLEETS))); do $(PY) -m sim --fleet $$f down; done; exit $$rc

down: venv
	$(PY) -m sim down
	for f in $(subst $(comma), ,$(E2E_FLEETS)); do $(PY) -m sim --fleet $$f down; done
