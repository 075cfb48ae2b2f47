"""RAG services on a host: dropped services removed, and every converge's probe.

A service is a vLLM unit `sparkfleet-vllm-<name>.service` running container `vllm-<name>`; the names follow
the settings grammar ([a-z][a-z0-9-]*), so they are safe unquoted, and anything read back from the host
that does not match it is ignored, never acted on.
"""

from __future__ import annotations

import json
import shlex

from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand, operation

from sparkfleet.contract import paths
from sparkfleet.host.operations import health_command, health_gate
from sparkfleet.host.state import unit_files
from sparkfleet.host.drift import only_on_drift

_SERVICE_UNIT = paths.SERVICE_UNIT




@only_on_drift
@operation()
def services_pruned(keep: list[str]):
    """Units of services no longer in the settings: stopped, disabled, their unit file and container gone; the
    socket and proxy of a service no longer on demand (or gone) first, so no request starts it again."""
    files = unit_files(host)
    stale = [unit for unit in files if _SERVICE_UNIT.fullmatch(unit) and unit not in keep]
    # sockets before proxies (sorted: "service" < "socket", so reversed)
    stale_on_demand = sorted((u for u in files if paths.ON_DEMAND_UNIT.fullmatch(u) and u not in keep), reverse=True)
    if not stale and not stale_on_demand:
        host.noop("no dropped service")
        return
    for unit in stale_on_demand:
        yield f"systemctl disable --now {unit} || true"
        yield f"rm -f {paths.unit_path(unit)}"
    for unit in stale:
        container = paths.service_container(_SERVICE_UNIT.fullmatch(unit).group(1))
        yield f"systemctl disable --now {unit} || true"
        yield f"docker rm -f {container} >/dev/null 2>&1 || true"
        yield f"rm -f {paths.unit_path(unit)}"
    yield "systemctl daemon-reload"


class ServiceProbe(FactBase[dict]):
    """One quick check of a service (the serving file's health, models and kind probes, each asked once with its
    running timeout) with the runtime bundle."""

    def command(self, port: int, served_name: str, kind: str, container: str):
        check = health_command(served_name, port, kind, container, runtime=f"\"$({paths.NEWEST_RUNTIME_COMMAND})\"",
                               wait=["--once"])
        return f"out=$({check.get_raw_value()} 2>&1); rc=$?; printf '%s\\n' \"$out\" | tail -1; echo \"rc=$rc\""

    def process(self, output):
        """{"serving", "detail": the helper's last line, "report": its JSON report when serving (models, chat)}."""
        detail = output[-2] if len(output) > 1 else ""
        serving = output[-1:] == ["rc=0"]
        try:
            report = json.loads(detail) if serving else None
        except ValueError:
            report = None
        return {"serving": serving, "detail": detail[-300:], "report": report if isinstance(report, dict) else None}


class OnDemandState(FactBase[dict]):
    """An on-demand model's units (its engine's and its socket's ActiveState) and the seconds since each on-demand
    model's last request, from the guard's stats (the host module's `last-requests`)."""

    def command(self, unit: str, socket: str):
        return (f"systemctl is-active {shlex.quote(unit)} {shlex.quote(socket)}; "
                f"python3 {paths.HOST_MODULE} last-requests {paths.GUARD_STATS_SOCKET} "
                f"2>/dev/null || echo '{{}}'")

    def process(self, output):
        """{"engine": its ActiveState, "socket": the socket's, "last": {listener: seconds or None}}."""
        try:
            last = json.loads(output[2]) if len(output) > 2 else {}
        except ValueError:
            last = {}
        return {"engine": output[0] if output else "unknown", "socket": output[1] if len(output) > 1 else "unknown",
                "last": last if isinstance(last, dict) else {}}


class UnitStarting(FactBase[bool]):
    """The unit is starting (its ExecStartPre or the image pull): wait for it, never restart it."""

    def command(self, unit: str):
        return f"systemctl is-active {shlex.quote(unit)} || true"

    def process(self, output):
        return output == ["activating"]


@operation()
def service_serving(unit: str, served_name: str, kind: str, port: int, timeout_s: int, runtime: str,
                    container: str):
    """A service answers now (serving means answering, not running); else it is restarted and gated."""
    probe = host.get_fact(ServiceProbe, port=port, served_name=served_name, kind=kind, container=container)
    if probe["serving"]:
        host.noop(f"{unit} answers its {kind} request")
        return
    if not host.get_fact(UnitStarting, unit=unit):
        yield StringCommand("echo", QuoteString(f"{unit} not serving: {probe['detail']}"[:400]), ">&2;",
                            "systemctl reset-failed", unit, "2>/dev/null;", "systemctl restart", unit)
    yield from health_gate._inner(served_name=served_name, port=port, tools=False,
                                  timeout_s=timeout_s, runtime=runtime, container=container, kind=kind, unit=unit)


def wake_command(api_port: int, wait_s: int) -> StringCommand:
    """An on-demand model asked through its socket, as its first request would ask it, until it answers: its proxy
    exits when idle only once a connection has come and gone (a proxy started by hand never would)."""
    return StringCommand("python3", paths.ON_DEMAND_HELPER, "wait",
                         f"{paths.ON_DEMAND_HOST}:{paths.engine_port(api_port)}", str(wait_s), paths.SERVING_FILE)


@operation(is_idempotent=False)
def on_demand_started(api_port: int, wait_s: int):
    """An on-demand model started through its socket (its proxy, then its engine), as its first request would."""
    yield wake_command(api_port, wait_s)
