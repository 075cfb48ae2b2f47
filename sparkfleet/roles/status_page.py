"""The office status page on a monitoring host: the console files Prometheus renders and the flags that load
them. The page is a Prometheus console template (templates/consoles/), served by Prometheus on loopback and by the
front door at /status to viewers (roles/front_door/plan.py); it needs no console library, so that directory is empty
(Debian's package ships none).

The template names no engine: where a name stands in double brackets (`[[running]]`), `console_files` puts each
engine's series from its descriptor (contract/engines.py), so a new engine's load, queue, KV gauge and tokens
reach the page with its descriptor."""

from __future__ import annotations

import html
import re
from pathlib import Path

from sparkfleet import TEMPLATES_DIR
from sparkfleet.contract import engines
from sparkfleet.contract import monitoring as m

SOURCE_DIR = Path(TEMPLATES_DIR) / "consoles"
_FIELD = re.compile(r"\[\[(\w+)\]\]")
_NOTHING = "`vector(0) < 0`"  # an empty answer: the page's `else` (no engine exports such a series)


def per_host(expr: str, series: tuple[str, ...] | list[str], each: str = "{}") -> str:
    """The page's `printf` of a PromQL expression over every engine's series (`or`, each selected on the row's
    host, `each` around it), with one `$host` for each: what a cell's `query` asks."""
    if not series:
        return _NOTHING
    selected = " or ".join(each.format(f"{name}{{host=%q}}") for name in series)
    return f"printf `{expr.format(selected)}` {' '.join(['$host'] * len(series))}"


def engine_fields() -> dict[str, str]:
    """What the page's engine cells ask, from the descriptors: each engine's label where its series exist, the
    served models (where an engine labels its series with model_name), requests running and waiting, the KV cache
    in use, the decode rate over the last hour."""
    found = engines.DESCRIPTORS.values()
    labels = "".join(f"{{{{ if query ({per_host('{}', [d.metrics.running])}) }}}} "
                     f"<span class=\"dim\">{html.escape(d.label)}</span>{{{{ end }}}}" for d in found)
    return {"engine_labels": labels,
            "models": per_host("max by (model_name) ({})", [d.metrics.running for d in found
                                                              if d.metrics.model_name_label]),
            "running": per_host("sum({})", engines.every("running")),
            "waiting": per_host("sum({}) > 0", engines.every("waiting")),
            "kv_usage": per_host("max({})", engines.every("kv_usage")),
            "decode": per_host("sum({})", engines.every("generation_tokens"), "rate({}[1h])")}


def render(template: str) -> str:
    """A console template with its engine fields filled in (engine_fields; an unknown field is a KeyError)."""
    fields = engine_fields()
    return _FIELD.sub(lambda match: fields[match.group(1)], template)


def console_files() -> dict[str, str]:
    """{path on the monitoring host: content} of the console templates (Go templates, their engine fields filled
    in from the descriptors)."""
    return {f"{m.PROMETHEUS_CONSOLES}/{m.STATUS_PAGE_FILE}": render((SOURCE_DIR / m.STATUS_PAGE_FILE).read_text())}


def prometheus_flags() -> list[str]:
    """The arguments of Prometheus's ExecStart that load the page."""
    return [f"--web.console.templates={m.PROMETHEUS_CONSOLES}",
            f"--web.console.libraries={m.PROMETHEUS_CONSOLE_LIBRARIES}"]
