"""only_on_drift: an operation is registered with pyinfra only where its own generator, on the batched read, would
yield a command; elsewhere the caller gets UNCHANGED, which answers like the meta of an operation that changed
nothing. A drifted host (and every operation after its first change), a conditional call and a reading that
raises all get the real operation."""

from __future__ import annotations

import pytest
from pyinfra.api import OperationError
from pyinfra.context import ctx_host, ctx_state
from pyinfra_testing.util import FakeState, create_host

from sparkfleet.contract import paths
from sparkfleet.host.drift import UNCHANGED, only_on_drift, would_change
from sparkfleet.host.managed import managed_file, managed_unit
from sparkfleet.host.operations import secret_file


def recorded(yields):
    """A stand-in operation: its calls are recorded, its generator yields `yields` (or raises)."""
    calls = []

    def op(*args, **kwargs):
        calls.append(kwargs)
        return "registered"

    def inner(dest, content="", name=None):
        assert name is None, "the name is pyinfra's, never the generator's"
        if yields == "raise":
            raise OperationError(f"{dest} is a directory")
        yield from yields

    op._inner = inner
    return only_on_drift(op), calls


@pytest.fixture
def a_host():
    """A host in pyinfra's context, its batched read empty."""
    state, host = on_host({})
    with state, host:
        yield


def test_an_operation_with_nothing_to_do_is_not_registered(a_host):
    op, calls = recorded([])
    assert op(name="A file", dest="/etc/x") is UNCHANGED and calls == []


def test_an_operation_that_would_change_something_is_registered_once_with_its_name(a_host):
    op, calls = recorded(["echo changed"])
    assert op(name="A file", dest="/etc/x") == "registered"
    assert calls == [{"name": "A file", "dest": "/etc/x"}]


def test_after_a_change_every_later_operation_on_the_host_is_registered(a_host):
    """The batched read is the host before this run: once an operation will change it (a package installed starts
    a unit; a secret rewritten as root loses its owner), pyinfra asks the later ones again when they run."""
    change, _ = recorded(["apt-get install haproxy"])
    later, calls = recorded([])
    change(name="A package", dest="/usr/sbin/haproxy")
    assert later(name="Its unit off", dest="/etc/x") == "registered" and len(calls) == 1


@pytest.mark.parametrize("argument", ["_if", "_sudo", "_ignore_errors"])
def test_an_operation_with_any_pyinfra_argument_is_registered_as_before(a_host, argument):
    op, calls = recorded([])
    assert op(name="A file", dest="/etc/x", **{argument: True}) == "registered" and len(calls) == 1


def test_a_reading_that_raises_is_left_to_pyinfra_which_reports_it_for_that_host(a_host):
    op, calls = recorded("raise")
    assert op(name="A file", dest="/etc/x") == "registered" and len(calls) == 1


def test_unchanged_answers_like_the_meta_of_an_operation_that_changed_nothing():
    assert UNCHANGED.will_change is False and UNCHANGED.executed is False
    assert UNCHANGED.did_change() is False and UNCHANGED.did_not_change() is True
    assert UNCHANGED.did_succeed() is True and UNCHANGED.is_complete() is True


SHA_OF_HELLO = "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"  # sha256 of b"hello\n"
FILE = {"type": "file", "mode": 0o644, "user": "root", "group": "root", "sha256": SHA_OF_HELLO}


def on_host(files: dict, units: dict | None = None):
    """A host whose batched read (sparkfleet/host/state.py) holds these files and units."""
    host = create_host(FakeState(), facts={"state.HostState": {"files": files, "units": units or {}}})
    host.name = "spark-1"
    return ctx_state.use(host.state), ctx_host.use(host)


def converged():
    return on_host({paths.SERVING_FILE: FILE, paths.ENGINE_ENV: dict(FILE, mode=0o600)},
                   {paths.UNIT_NAME: {"running": True, "enabled": True, "failed": False}})


def test_sparkfleets_own_operations_decide_before_pyinfra_is_asked():
    """A current file, a running unit, a current secret: none is registered (FakeState has no operations)."""
    state, host = converged()
    with state, host:
        assert managed_file(name="A file", dest=paths.SERVING_FILE, content="hello\n") is UNCHANGED
        assert managed_unit(name="The engine", service=paths.UNIT_NAME, running=True, enabled=True) is UNCHANGED
        assert secret_file(name="A secret", dest=paths.ENGINE_ENV, content="hello\n") is UNCHANGED


@pytest.mark.parametrize("call", [
    lambda: (managed_file, {"name": "A file", "dest": paths.SERVING_FILE, "content": "edited by hand\n"}),
    lambda: (managed_file, {"name": "A file", "dest": paths.SERVING_FILE, "content": "hello\n", "mode": "0600"}),
    lambda: (managed_unit, {"name": "The engine", "service": paths.UNIT_NAME, "running": True, "restarted": True}),
    lambda: (managed_unit, {"name": "The engine", "service": paths.UNIT_NAME, "enabled": False}),
    lambda: (secret_file, {"name": "A secret", "dest": paths.ENGINE_ENV, "content": "rotated\n"}),
])
def test_a_drift_or_an_asked_restart_still_gets_its_operation(call):
    op, kwargs = call()
    state, host = converged()
    with state, host:
        assert would_change(op, (), kwargs)
