#!/usr/bin/env bash
# `make test`, what CI runs: ruff and mypy first; then the end-to-end modules on the simulated fleets of E2E_FLEETS,
# and beside them the unit tests (their fast lane, then the lane that runs programs of this machine) and the
# simulator's tests. The fleets spend most of their time waiting on their hosts (boots, engine starts, watchdog
# ticks, the soak's load): the other tests use that time instead of adding theirs before e2e begins. Their output
# is printed whole once they end; the run fails when either side does.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
.venv/bin/ruff check sparkfleet files tools && .venv/bin/mypy || exit 1
bash sim/bootstrap.sh || exit 1
$PY -m sim build || exit 1
side=$(mktemp -t sparkfleet-side-XXXXXX.log)
(
    for lane in "tests/unit --lane fast" "tests/unit --lane programs" "tests/sim"; do
        echo "== pytest $lane =="
        # shellcheck disable=SC2086  # the lane's words
        $PY -m pytest $lane -n 2 -q -p no:cacheprovider || exit 1
    done
) > "$side" 2>&1 &
side_pid=$!
make --no-print-directory e2e-only
e2e=$?
wait "$side_pid"
others=$?
echo "== the unit and simulator tests, run beside e2e (exit $others) =="
cat "$side"
rm -f "$side"
[ "$e2e" -eq 0 ] && [ "$others" -eq 0 ]
