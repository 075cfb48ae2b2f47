"""Waiting on a condition, with a deadline: the one poll every tier uses instead of a fixed sleep.

A fixed sleep stands for a condition (a server up, a backend marked down, a tick of the watchdog): poll that
condition instead. Where a test asserts that something does NOT happen, its window is the mechanism's own (the
next tick or event of what would have caused it), waited for here and named in a comment at the wait.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_until(check: Callable[[], T], timeout_s: float, what: str = "", *, step_s: float = 1.0,
               explain: Callable[[], str] | None = None, ignore: tuple[type[BaseException], ...] = ()) -> T:
    """check()'s first truthy value, polled every step_s; AssertionError past timeout_s naming `what` (and
    explain()'s text, if given). Exceptions of the `ignore` types count as not yet (a server still starting)."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            value = last = check()
            if value:
                return value
        except ignore as exc:
            last = exc
        if time.monotonic() >= deadline:
            detail = explain() if explain else f"last: {last!r}"
            raise AssertionError(f"{what or 'the condition'} not within {timeout_s:g} s: {detail}")
        time.sleep(max(0.0, min(step_s, deadline - time.monotonic())))  # the last check is at the deadline


def seconds_until(check: Callable[[], object], timeout_s: float, what: str = "", **options) -> float:
    """wait_until, and the seconds it took."""
    t0 = time.monotonic()
    wait_until(check, timeout_s, what, **options)
    return time.monotonic() - t0
