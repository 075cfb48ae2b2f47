"""tools/bench_freeze.py's reading of a run (issue 54): 5-second windows against the quiet rate, the longest wait of
a request started after the fault, failures by class."""

from __future__ import annotations

from tools.bench_freeze import Done, windows


def test_windows_quiet_rate_stall_and_failures():
    quiet = [Done(-10 + i, -10 + i + 0.5, "ok") for i in range(10)]  # 5 a window before the fault
    stalled = Done(1.0, 13.0, "ok")  # started after the fault, waited 12 s
    failed = Done(-0.5, 3.5, "http 502")
    after = [Done(5 + i, 5.5 + i, "ok") for i in range(5)]
    read = windows([*quiet, stalled, failed, *after], quiet_s=10, after_s=15)
    assert [w["completed"] for w in read["windows"]] == [5, 5, 0, 5, 1]
    assert read["quiet_rate"] == 5.0 and read["low_windows"] == [0.0, 10.0]
    assert read["max_wait_after_s"] == 12.0 and read["over_bound"] == 1
    assert read["failed"] == {"http 502": 1} and read["requests"] == 17
