#!/usr/bin/env bash
# `make test`, what CI runs: ruff and mypy first; then the unit tests (their fast lane, then the lane that runs
# programs of this machine) in the background while the simulator's images build, its own tests run and the
# end-to-end modules run on the simulated fleets of E2E_FLEETS. On 2 cores the fleets leave part of the machine idle
# (about a quarter once they are up): the unit tests use some of it instead of adding their minutes before e2e, which
# shortened the whole run by about one minute (e2e itself runs longer meanwhile). Their output is printed whole once
# they end; the run fails when any part does.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
.venv/bin/ruff check sparkfleet files tools && .venv/bin/mypy || exit 1
bash sim/bootstrap.sh || exit 1  # the programs the second lane runs, and dockerd
side=$(mktemp -t sparkfleet-unit-XXXXXX.log)
(
    for lane in fast programs; do
        echo "== pytest tests/unit --lane $lane =="
        $PY -m pytest tests/unit -n 2 -q -p no:cacheprovider --lane "$lane" || exit 1
    done
) > "$side" 2>&1 &
side_pid=$!
rc=0
$PY -m sim build && $PY -m pytest tests/sim -n 2 -q -p no:cacheprovider && make --no-print-directory e2e-only || rc=1
wait "$side_pid" || rc=1
echo "== the unit tests, run beside the simulator's and e2e =="
cat "$side"
rm -f "$side"
exit "$rc"
