"""The office status page on a monitoring host: the console files Prometheus renders and the flags that load
them. The page is a Prometheus console template (templates/consoles/), served by Prometheus on loopback and by the
front door at /status to viewers (roles/front_door/plan.py); it needs no console library, so that directory is empty
(Debian's package ships none)."""

from __future__ import annotations

from pathlib import Path

from sparkfleet import TEMPLATES_DIR
from sparkfleet.contract import monitoring as m

SOURCE_DIR = Path(TEMPLATES_DIR) / "consoles"


def console_files() -> dict[str, str]:
    """{path on the monitoring host: content} of the console templates (Go templates, shipped as they are)."""
    return {f"{m.PROMETHEUS_CONSOLES}/{m.STATUS_PAGE_FILE}": (SOURCE_DIR / m.STATUS_PAGE_FILE).read_text()}


def prometheus_flags() -> list[str]:
    """The arguments of Prometheus's ExecStart that load the page."""
    return [f"--web.console.templates={m.PROMETHEUS_CONSOLES}",
            f"--web.console.libraries={m.PROMETHEUS_CONSOLE_LIBRARIES}"]
