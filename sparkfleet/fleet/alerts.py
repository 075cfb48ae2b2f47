"""`status` reads the alerts: each monitoring host's Prometheus (loopback only, reached through an SSH forward)
says which alerts fire, and for which host. Its answer is a host's, so it is data: only string labels are kept,
cut short, and a Prometheus that does not answer, or answers something else, is one line saying so.
"""

from __future__ import annotations

import json

from sparkfleet.contract import monitoring as m
from sparkfleet.contract.settings import parse_settings
from sparkfleet.fleet.metrics import CappedGetError, capped_get

READ_TIMEOUT_S = 10
MAX_ANSWER_BYTES = 4 * 1024 * 1024
MAX_CHARS = 200  # a label or summary longer than this is cut


class AlertsUnavailable(RuntimeError):
    """Prometheus did not answer, or its answer was not the alerts API's."""


def _text(value) -> str:
    return "".join(c for c in value if c.isprintable())[:MAX_CHARS] if isinstance(value, str) else ""


def firing(answer: bytes) -> list[dict]:
    """/api/v1/alerts's body -> the firing alerts [{alert, host, summary}], sorted; AlertsUnavailable when it is
    not that API's answer."""
    try:
        found = json.loads(answer)
        alerts = found["data"]["alerts"] if found.get("status") == "success" else None
    except (ValueError, KeyError, TypeError, AttributeError):
        alerts = None
    if not isinstance(alerts, list):
        raise AlertsUnavailable("its answer is not the alerts API's")
    out = []
    for alert in alerts:
        if not isinstance(alert, dict) or alert.get("state") != "firing":
            continue
        labels = alert.get("labels") if isinstance(alert.get("labels"), dict) else {}
        notes = alert.get("annotations") if isinstance(alert.get("annotations"), dict) else {}
        out.append({"alert": _text(labels.get("alertname")) or "?", "host": _text(labels.get("host")) or "?",
                    "summary": _text(notes.get("summary"))})
    return sorted(out, key=lambda a: (a["host"], a["alert"], a["summary"]))


def read_alerts(url: str) -> list[dict]:
    """The firing alerts of the Prometheus at `url`."""
    try:
        body = capped_get(url + m.ALERTS_API_PATH, MAX_ANSWER_BYTES, READ_TIMEOUT_S)
    except CappedGetError as exc:
        raise AlertsUnavailable(f"{m.ALERTS_API_PATH} {exc}") from None
    return firing(body)


def fleet_alerts(inventory: str) -> dict | None:
    """What `status` shows of the alerts: {"firing": [...], "problems": [one line per silent Prometheus]};
    None when the inventory has no monitoring host."""
    from sparkfleet.controller.inventory import group_hosts
    from sparkfleet.fleet.speed import ReachError, forwarded

    hosts = group_hosts(inventory, m.GROUP)
    if not hosts:
        return None
    found, problems = [], []
    for name, data in hosts:
        port = parse_settings(name, data).monitoring_port
        try:
            with forwarded(name, data, port) as url:
                found += [{**a, "monitoring": name} for a in read_alerts(url)]
        except (ReachError, AlertsUnavailable) as exc:
            problems.append(f"monitoring on {name}: Prometheus (127.0.0.1:{port}) did not answer the alerts: {exc}")
    return {"firing": found, "problems": problems}


def alerts_ok(alerts: dict | None) -> bool:
    return alerts is None or not (alerts["firing"] or alerts["problems"])
