"""Serving, not just running: the converge probes each host the way its watchdog does, and heals one
that does not answer (restart, then the full health gate). A healthy host costs one command."""

from __future__ import annotations

import json
import re
import shlex

from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand, operation

from sparkfleet.contract import paths
from sparkfleet.host.operations import health_gate
from sparkfleet.host.state import unit_state
from sparkfleet.host.drift import only_on_drift

# its engine, rules and probes: the serving file
WATCHDOG_RUN = f"python3 {paths.WATCHDOG} --config {paths.SERVING_FILE}"


def probe_verdict(probe: dict) -> str:
    """serving, busy (its probe timed out behind the office's work, which moves: leave it), starting (wait for it,
    never restart it) or down (restart and gate)."""
    if probe.get("serving"):
        return "serving"
    if probe.get("busy"):
        return "busy"
    return "starting" if probe.get("starting") else "down"


def _gpu_lost(probe: dict) -> str | None:
    """The lost-GPU line, when the probe found the engine container blind."""
    if probe.get("gpu_visible") is False:
        return f"the engine container cannot see the GPU: {probe.get('gpu_detail')}"
    return None


def describe(probe: dict) -> str:
    """One line naming what failed; a lost GPU is named as such."""
    if probe.get("failed") == "absent":
        return "the watchdog probe is not installed yet"
    problems = [] if probe.get("failed") in (None, "gpu") else [f"{probe['failed']} failed: {probe.get('detail')}"]
    lost = _gpu_lost(probe)
    if lost:
        problems.append(lost)
    return "; ".join(problems) or "no answer"


def watchdog_summary(probe: dict) -> dict:
    """What `status` shows per host: the watchdog's last verdict, and a problem a person must look at
    (the watchdog gave up, or the engine container lost the GPU), or None."""
    state = probe.get("watchdog") or {}
    last = state.get("last_probe")
    problem = _gpu_lost(probe)
    if state.get("gave_up"):
        problem = f"watchdog gave up after {probe.get('restarts_in_window', 0)} restarts: {state.get('detail')}"
    return {"last_probe_s_ago": round(probe["now"] - last) if last and probe.get("now") else None,
            "last_result": state.get("last_result"), "consecutive_failures": state.get("consecutive_failures", 0),
            "restarts_in_window": probe.get("restarts_in_window", 0), "gave_up": bool(state.get("gave_up")),
            "gpu_visible": probe.get("gpu_visible"), "serving": bool(probe.get("serving")), "problem": problem}


class ServingProbe(FactBase[dict]):
    """The watchdog's probe (the serving file's health and chat probes, nvidia-smi -L in the engine container, or
    the watchdog's last check of it when from this start and recent) and the unit's start. A host's older watchdog,
    read before the converge replaces it, refuses the option: the plain probe answers then."""

    def command(self):
        absent = json.dumps({"serving": False, "failed": "absent", "detail": paths.WATCHDOG, "starting": False})
        return (f"if [ -x {paths.WATCHDOG} ]; then {WATCHDOG_RUN} --probe --gpu-from-watchdog 2>/dev/null "
                f"|| {WATCHDOG_RUN} --probe; else echo '{absent}'; fi")

    def process(self, output):
        try:
            return json.loads(output[-1])
        except (ValueError, IndexError):
            return {"serving": False, "failed": "probe", "detail": " ".join(output)[-300:], "starting": False}


def _key_header(key_var: str) -> str:
    """A sed script: curl's config on stdin carries the key from engine.env's `key_var` line (never a command
    line): its header line, quoted as a curl config string (\\ and " escaped); no key line, no header."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key_var):
        raise ValueError(f"{key_var!r} is not an env variable name")
    return shlex.quote(f"s/^{key_var}=//; T; " + r's/[\\"]/\\&/g; s/.*/header = "Authorization: Bearer &"/p')


class EngineMetrics(FactBase[str]):
    """The engine's /metrics lines of the series `names`, read on the host: `status` of an engine on loopback.
    Where the engine's key guards /metrics too (contract/engines.py `metrics_need_key`), `key_var` names its
    engine.env line: the key goes from there to curl on its stdin. Empty when nothing answered."""

    @staticmethod
    def default() -> str:
        return ""

    def command(self, port: int, names: tuple[str, ...], key_var: str | None = None):
        wanted = shlex.quote("^(" + "|".join(names) + ")[{ ]")
        url = f"http://{paths.ENGINE_HOST}:{int(port)}/metrics"
        if key_var:
            return (f"sed -nE {_key_header(key_var)} {paths.ENGINE_ENV} 2>/dev/null | curl -fsS --max-time 5 -K - {url}"
                    f" 2>/dev/null | grep -E {wanted} || true")
        return f"curl -fsS --max-time 5 {url} 2>/dev/null | grep -E {wanted} || true"

    def process(self, output):
        return "\n".join(output)


@only_on_drift
@operation()
def start_limit_cleared(unit: str):
    """A converge tries a failed unit again: systemd's start limit (which ended a crash loop) is reset, so
    the start that follows is not refused as "repeated too quickly"."""
    if not unit_state(host, unit)["failed"]:
        host.noop(f"{unit} is not failed")
        return
    yield StringCommand("systemctl reset-failed", QuoteString(unit))


@operation()
def serving(served_name: str, port: int, tools: bool, timeout_s: int, runtime: str, container: str):
    """The engine answers now; else restart it (never one still starting: wait) and run the health gate."""
    probe = host.get_fact(ServingProbe)
    verdict = probe_verdict(probe)
    if verdict == "serving":
        host.noop("answers: /health, a 1-token chat, the GPU in the engine container")
        return
    if verdict == "busy":
        host.noop(f"busy, left serving: {probe.get('detail')}"[:400])
        return
    if verdict == "down":
        yield StringCommand("echo", QuoteString(f"not serving: {describe(probe)}"[:400]), ">&2;",
                            WATCHDOG_RUN, "--restart", "converge")
    yield from health_gate._inner(served_name=served_name, port=port, tools=tools,
                                  timeout_s=timeout_s, runtime=runtime, container=container)
    yield f"{WATCHDOG_RUN} --check"


def watchdog_cell(summary: dict | None) -> str:
    """The `status` table's watchdog column: last verdict and when; failures in a row, restarts in the window and
    the GPU in the engine container only when they are not nil and seen; what needs a person in red."""
    if not summary:
        return "-"
    from sparkfleet.tables import literal  # the host wrote the summary: its strings print as text

    if summary["last_probe_s_ago"] is None:
        last = "no probe yet"
    else:
        last = literal(f"{summary['last_result']} {summary['last_probe_s_ago']} s ago")
    parts = [last] + [literal(f"{summary[key]} {what}") for key, what in
                      (("consecutive_failures", "failing"), ("restarts_in_window", "restarts")) if summary[key] != 0]
    if summary["gpu_visible"] is not True:  # a narrow cell: only what is not as it should be
        parts.append("[red]GPU LOST[/]" if summary["gpu_visible"] is False else "GPU ?")
    cell = ", ".join(parts)
    return f"[red]GAVE UP[/], {cell}" if summary["gave_up"] else cell
