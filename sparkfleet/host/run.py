"""One pyinfra run's shared state, and the stages' results by name.

pyinfra loads every host's deploy code at the same time (one greenlet each): what the hosts of a run share (the
inventory's plans, each host's preflight reading, each group's, the health gates a rollout judges) lives in one
`Run`, made on first use for pyinfra's state and held here, not as attributes on that state. The stage results
live here too, not in `sparkfleet/tasks/`: `host/operations`, their lowest user, sits layers below the stages.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from weakref import WeakKeyDictionary

from gevent.event import AsyncResult
from pyinfra.api.operation import OperationMeta
from pyinfra.context import ContextObject

T = TypeVar("T")


@dataclass(eq=False)
class Run:
    """What one pyinfra run's hosts share. `once` is the guard: computed by the first caller, awaited by the
    others, so one hub resolve (and one preflight reading per host or group) serves the whole run."""

    settled: dict[tuple[str, Hashable], AsyncResult] = field(default_factory=dict, repr=False)
    health_gates: dict[str, list[OperationMeta]] = field(default_factory=dict)
    drifted: set[str] = field(default_factory=set)  # hosts an operation of this run will change (host/drift.py)

    def once(self, kind: str, name: Hashable, compute: Callable[[], T]) -> T:
        """compute() for (kind, name), once per run; a failure is every caller's failure."""
        key = (kind, name)
        if key not in self.settled:
            result = self.settled[key] = AsyncResult()
            try:
                result.set(compute())
            except BaseException as exc:
                result.set_exception(exc)
                raise
        return self.settled[key].get()


_RUNS: WeakKeyDictionary[Any, Run] = WeakKeyDictionary()


def run_of(state) -> Run:
    """The Run of pyinfra's `state` (one per run: a new State, a new Run), or of the State behind pyinfra's
    `from pyinfra import state`. Check and set do not yield, so greenlets cannot make two."""
    if isinstance(state, ContextObject):
        state = state._get_module()
    run = _RUNS.get(state)
    if run is None:
        run = _RUNS[state] = Run()
        name_deploy_file(getattr(state, "current_deploy_filename", None))
    return run


def as_the_host_runs(host, command, timeout: float | None = None) -> tuple[bool, Any]:
    """A command sent on the host's own connection outside any operation (a watch's poll, a door's runtime, the
    speed record, a Ray check, a reboot's question), with the host's own escalation and shell settings (`_sudo`,
    `_su_user`, ...) as pyinfra's operations and facts get them: a Spark reached as a user with sudo gets the
    same privileges here as in the deploy. (ok, pyinfra's CommandOutput); never printed."""
    from pyinfra.api import StringCommand
    from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments

    arguments, _ = pop_global_arguments(host.state, host, {})
    kept = {k: v for k, v in arguments.items() if k in CONNECTOR_ARGUMENT_KEYS and k not in ("_stdin", "_retries")}
    if timeout is not None:
        kept.update(_timeout=timeout, _get_pty=False)
    return host.run_shell_command(command if isinstance(command, StringCommand) else StringCommand(command),
                                  print_output=False, print_input=False, **kept)


def name_deploy_file(filename: str | None) -> None:
    """pyinfra orders each operation by its call stack (`inspect.stack()`, per operation and host). For a frame
    of the deploy file, which pyinfra execs and no module names, `inspect.getmodule` scans every loaded module
    (~1,000) each time: on a no-op converge, most of the controller's CPU per host. A module named for the file
    turns that scan into a lookup; nothing else reads it."""
    if filename:
        path = os.path.abspath(filename)
        module = sys.modules.setdefault(f"sparkfleet-deploy-file:{path}", types.ModuleType("sparkfleet-deploy-file"))
        module.__file__ = path


@dataclass(frozen=True)
class ModelResult:
    """The model stage's result: where the host's clients run from, and whether each model's files change."""

    runtime: str
    fetched: OperationMeta
    services_fetched: dict[str, OperationMeta]


@dataclass(frozen=True)
class ServiceResult:
    """The service stage's result: the engine's start (None on a worker, which runs none), the model dirs every
    kept release needs, and each RAG service's start by name."""

    started: OperationMeta | None
    keep: list[str]
    services_started: dict[str, OperationMeta]
