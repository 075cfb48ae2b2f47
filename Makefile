# The two commands of the README: `make demo` and `make test`.
PY := .venv/bin/python
HOSTS ?= 3

.PHONY: venv demo test unit e2e down

venv:
	@bash scripts/venv.sh

## Converge three simulated Sparks for real, verify them, show them.
demo: venv
	@bash sim/bootstrap.sh
	$(PY) -m sim up --hosts $(HOSTS)
	.venv/bin/pyinfra -y inventory/sim.py deploy.py
	$(PY) -m pytest tests/infra --inventory inventory/sim.py -q -p no:cacheprovider
	$(PY) -m sparkfleet status inventory/sim.py --chat

## Unit tests, then end-to-end tests against the simulated fleet.
test: venv
	@bash sim/bootstrap.sh
	$(PY) -m pytest -v --durations=15

unit: venv
	$(PY) -m pytest tests/unit -q

e2e: venv
	@bash sim/bootstrap.sh
	$(PY) -m pytest tests/e2e -v --durations=15

down: venv
	$(PY) -m sim down
