"""Operations called only where they would change something.

Each operation costs the controller pyinfra's bookkeeping (the call stack it reads to order operations, the
global arguments it resolves from the host's data), a few milliseconds a host whether or not it yields a
command. sparkfleet's operations decide from one batched read (sparkfleet/host/state.py), so that decision can
be made before pyinfra is asked: an operation that would yield nothing on this host is not registered, and the
caller gets UNCHANGED, pyinfra's own OperationMeta completed as an operation that ran no command (what pyinfra
itself hands back for an operation it does not run on a host, `_run_once`, made complete).

The question asked is pyinfra's own (OperationMeta.will_change, and its check for changes when an operation is
registered): does the operation's generator yield a command? It is asked of the same generator, to its first
command. Up to that command a generator reads the host and decides: it looks at nothing pyinfra sets only while
it runs an operation (host.current_op_*), so it answers this probe as it answers pyinfra, and it changes nothing
on the controller (no held read forgotten, no run state touched), so being asked has no effect.
tests/unit/test_drift.py holds every operation here to both. What an operation checks of its call (secret_file's
`name=`) is checked at the call (operations.py `named`), before either asks.

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
from pyinfra.api.operation import OperationMeta
from pyinfra.connectors.util import CommandOutput

from sparkfleet.host.run import run_of


def completed_unchanged() -> OperationMeta:
    """pyinfra's OperationMeta of an operation that ran, succeeded and sent no command: will_change, did_change()
    and executed False, did_succeed() and is_complete() True, no output (tests/unit/test_drift.py compares every
    public answer with a registered operation's that yielded nothing)."""
    meta = OperationMeta("sparkfleet-unchanged", is_change=False)
    meta.set_complete(True, [], CommandOutput([]))
    return meta


UNCHANGED = completed_unchanged()


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
    call.only_on_drift = True
    return call
