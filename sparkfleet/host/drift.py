"""Operations called only where they would change something.

Each operation costs the controller pyinfra's bookkeeping (the call stack it reads to order operations, the
global arguments it resolves from the host's data), a few milliseconds a host whether or not it yields a
command. sparkfleet's operations decide from one batched read (sparkfleet/host/state.py), so that decision can
be made before pyinfra is asked: an operation that would yield nothing on this host is not registered, and the
caller gets UNCHANGED, which answers like the meta of an operation that changed nothing.

That read is the host as it was before this run. So the decision is made up front only while no operation of
this run will change the host: once one will (a hand-edited file, a stopped unit, a restart asked for, a first
install), every later operation on that host is registered as before, and pyinfra asks it again when it runs,
after the changes before it (a package's install starts a unit an operation after it stops; a secret rewritten
as root is given to its service's user by the next). A converged host, the case that costs the controller on
every run, registers none. Where the decision cannot be made up front (a conditional `_if`, any pyinfra
argument, an error in the reading), the operation is registered as before and pyinfra reports it for this host.
"""

from __future__ import annotations

import functools

from pyinfra import host, state

from sparkfleet.host.run import run_of


class Unchanged:
    """The answers of an operation's meta (pyinfra's OperationMeta) for one that ran and changed nothing."""

    will_change = False
    executed = False

    def did_change(self) -> bool:
        return False

    def did_not_change(self) -> bool:
        return True

    def did_succeed(self, _raise_if_not_complete: bool = True) -> bool:
        return True

    def is_complete(self) -> bool:
        return True


UNCHANGED = Unchanged()


def would_change(op, args: tuple, kwargs: dict) -> bool:
    """Whether the operation's own generator yields a command for this host now (its name aside); True when it
    cannot tell (it raised: the real call raises it where pyinfra reports it)."""
    try:
        return next(iter(op._inner(*args, **{k: v for k, v in kwargs.items() if k != "name"})), None) is not None
    except Exception:  # noqa: BLE001 - the real call raises it again, reported for this host by pyinfra
        return True


def only_on_drift(op):
    """Wrap a pyinfra operation whose commands depend only on the batched read and its arguments."""

    @functools.wraps(op)
    def call(*args, **kwargs):
        drifted = run_of(state).drifted
        if host.name in drifted or any(key.startswith("_") for key in kwargs) or would_change(op, args, kwargs):
            drifted.add(host.name)
            return op(*args, **kwargs)
        return UNCHANGED

    call._inner = op._inner
    return call
