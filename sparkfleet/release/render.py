"""Render what a release puts on a host: the units and env files, from templates that look like them."""

from __future__ import annotations

import re

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from sparkfleet import TEMPLATES_DIR
from sparkfleet.host import paths

_templates = Environment(
    loader=FileSystemLoader(TEMPLATES_DIR),
    undefined=StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
)

_SYSTEMD_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def systemd_quote(arg: str) -> str:
    """Quote one argument for a unit line (systemd's own quoting rules: `%` specifiers, `$` variables).

    A control character cannot be quoted (a newline ends the directive), so it
    is refused here too, though the settings types already refuse it.
    """
    if _CONTROL.search(arg):
        raise ValueError("a control character cannot be written into a systemd unit line")
    arg = arg.replace("%", "%%").replace("$", "$$")
    if _SYSTEMD_SAFE.fullmatch(arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


_templates.globals["q"] = systemd_quote  # every template quotes a value for its unit line as {{ q(value) }}


def _pairs(args: list[str]) -> list[list[str]]:
    """Group `--flag value` pairs so the unit shows one flag per line."""
    grouped: list[list[str]] = []
    for arg in args:
        if grouped and not arg.startswith("-") and grouped[-1][0].startswith("-") and len(grouped[-1]) == 1:
            grouped[-1].append(arg)
        else:
            grouped.append([arg])
    return grouped


def _lines(args: list[str]) -> list[str]:
    return [" ".join(systemd_quote(a) for a in pair) for pair in _pairs(args)]


def unit(plan) -> str:
    return _templates.get_template("sparkfleet-vllm.service.j2").render(
        s=plan.settings,
        release_id=plan.release_id or "unresolved",
        release_file=paths.RELEASE_FILE,
        bin_dir=paths.BIN_DIR,
        docker_options=_lines(plan.docker_options),
        engine_args=_lines(plan.engine_args),
    )


def share_unit(s, lan_address: str) -> str:
    return _templates.get_template("sparkfleet-share.service.j2").render(
        s=s, lan_address=lan_address, bin_dir=paths.BIN_DIR, token_file=paths.FLEET_TOKEN, user=paths.SHARE_USER)


def engine_env(s) -> str:
    return _templates.get_template("engine.env.j2").render(s=s)


def hub_env(s) -> str:
    return _templates.get_template("hub.env.j2").render(s=s)
