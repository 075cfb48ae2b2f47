"""Run a deploy file over some hosts of an inventory through pyinfra's API, and say what happened.

The CLI runs one deploy over a whole inventory; a rollout needs batches,
each judged before the next starts (pyinfra's --serial does not stop on
failure). This is the same deploy.py, run per batch: the project's own
when it has one, else the one the package ships (`deploy_path`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pyinfra.api import Config, State
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operations import run_ops
from pyinfra.context import ctx_config, ctx_inventory, ctx_state
from pyinfra_cli.util import load_deploy_file

import sparkfleet
from sparkfleet import DEPLOYS_DIR
from sparkfleet.controller import progress
from sparkfleet.controller.inventory import project_of, read_inventory
from sparkfleet.host.operations import health_gate_results


@dataclass
class HostResult:
    name: str
    connected: bool = True
    changed: list[str] = field(default_factory=list)  # operations that changed something
    failed: list[str] = field(default_factory=list)  # operations that failed (or never ran after one did)
    health_gate: str | None = None  # "passed" | "failed": the gate's own result; None when it did not run
    said: list[str] = field(default_factory=list)  # what the failed operations printed last on stderr (`host_said`)

    @property
    def ok(self) -> bool:
        return self.connected and not self.failed


@contextmanager
def connected(inventory_path: str, hosts: list[str], data: dict | None = None):
    """pyinfra's state, with `hosts` of the inventory connected (those that answered); the inventory read in its
    project (`read_inventory`: its group_data/ over sparkfleet's defaults), pyinfra's cwd (the deploy's relative
    paths) that project (`project_of`), not the current directory."""
    project = str(project_of(inventory_path))
    state = State(check_for_changes=False)
    state.cwd = project
    config = Config()
    with ctx_state.use(state), ctx_config.use(config):
        inventory = read_inventory(inventory_path, override_data=data)
        with ctx_inventory.use(inventory):
            limit = [inventory.get_host(name) for name in hosts]
            state.init(inventory, config, initial_limit=limit)
            try:
                try:
                    connect_all(state)
                except PyinfraError:  # none answered
                    pass
                yield state, limit
            finally:
                disconnect_all(state)


def wrote_state_file(inventory_path: str, host: str, path: str, text: str, also: str = "") -> bool:
    """`text` put whole at `path` on `host` (a temporary file beside it, then a rename: a reader never sees half
    of it), under the state directory, in one SSH command with the host's escalation; `also`: a shell command run
    after it in the same round trip. Whether it was written: a gate's record (the speed and quality records) is
    reported when it was not, never fatal."""
    import shlex

    from sparkfleet.contract.paths import STATE_DIR
    from sparkfleet.host.run import as_the_host_runs

    command = f"umask 022 && mkdir -p {shlex.quote(STATE_DIR)} && {replace_file_command(path, text)}"
    command += f" && {also}" if also else ""
    with connected(inventory_path, [host]) as (state, limit):
        return bool(limit) and limit[0] not in state.failed_hosts and as_the_host_runs(limit[0], command)[0]


def replace_file_command(path: str, text: str) -> str:
    """A shell command putting `text` at `path` whole: a temporary file beside it, then a rename."""
    import shlex

    tmp = f"{path}.tmp"
    return f"printf '%s' {shlex.quote(text)} > {shlex.quote(tmp)} && mv -f {shlex.quote(tmp)} {shlex.quote(path)}"


def read_hosts(inventory_path: str, hosts: list[str], reader) -> dict[str, dict | None]:
    """reader(host) -> dict for each host that answers over SSH; None for those that do not."""
    with connected(inventory_path, hosts) as (state, limit):
        return {h.name: None if h in state.failed_hosts else reader(h) for h in limit}


def deploy_path(name: str, project: Path | None = None) -> Path:
    """The deploy file `name` (deploy.py, rollback.py) a fleet command runs: the project's own when it holds one
    (pyinfra's convention; `run_deploy` names the inventory's project, `project_of`; by default
    `sparkfleet.PROJECT_ROOT`), else the one sparkfleet ships."""
    own = Path(project if project is not None else sparkfleet.PROJECT_ROOT) / name
    return own if own.is_file() else DEPLOYS_DIR / name


SAID_MAX_CHARS = 300


def host_said(lines: list[str], keep: int = 3) -> list[str]:
    """The last few non-empty lines a failed command printed, for a report: a host's words are untrusted, so
    only printable characters are kept (no escape sequence reaches the terminal) and each line is cut short."""
    kept = ["".join(c for c in line if c.isprintable()).strip()[:SAID_MAX_CHARS] for line in lines]
    return [line for line in kept if line][-keep:]


def run_deploy(inventory_path: str, hosts: list[str], data: dict | None = None,
               deploy_file: str = "deploy.py", before_ops: Callable[[], None] | None = None) -> dict[str, HostResult]:
    """Run deploy_file (`deploy_path` finds it) on `hosts` (names in the inventory); results per host.

    `before_ops` is called once the deploy is loaded (hosts connected, facts read, operations planned), right
    before the operations run: a rollout drains its batch there, so a host is out of rotation while its
    operations run, not while pyinfra connects and plans."""
    results = {name: HostResult(name) for name in hosts}
    with connected(inventory_path, hosts, data) as (state, limit):
        for host in limit:
            if host in state.failed_hosts:
                results[host.name].connected = False
                results[host.name].failed.append("unreachable over SSH")
        if len(state.failed_hosts) < len(limit):
            try:
                # the stages register the hosts whose fetch or engine start is shown while run_ops runs
                load_deploy_file(state, str(deploy_path(deploy_file, project_of(inventory_path))))
                if before_ops is not None:
                    before_ops()
                run_ops(state)
            except PyinfraError as exc:  # a refusal while loading (nothing ran), or "No hosts remaining!"
                for host in limit:
                    if not results[host.name].failed:
                        results[host.name].failed.append(str(exc))
            finally:
                progress.close(state)
        for op_hash in state.get_op_order():
            name = sorted(state.op_meta[op_hash].names)[0]
            for host in limit:
                if op_hash not in state.ops[host]:
                    continue
                meta = state.ops[host][op_hash].operation_meta
                if meta.did_succeed(_raise_if_not_complete=False):
                    if meta.did_change():
                        results[host.name].changed.append(name)
                elif results[host.name].connected:
                    results[host.name].failed.append(name)
                    if meta.is_complete():
                        results[host.name].said += host_said(meta.stderr_lines)
        for name, gate in health_gate_results(state).items():
            results[name].health_gate = gate
    return results
