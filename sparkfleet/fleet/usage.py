"""`sparkfleet usage`: what each front door counted per user and per model (files/sparkfleet-usage.lua), read
from its /usage/metrics with the backend key at the URL the controller reaches it by.

The answer is host output, so untrusted: read up to MAX_BYTES, parsed by a strict reader of the few lines the
Lua file writes (the Prometheus text format's comments, and samples of the USAGE_METRICS names with a `user`
and maybe a `model` label); anything else fails the whole answer. Label values are data: printed as text,
never markup. The per-user-and-model counts are each door's, from its snapshot on (files/sparkfleet-usage.lua):
they never go back across a restart, a reload or a takeover; the doors' sum is the fleet's.
"""

from __future__ import annotations

import math
import re

from sparkfleet.contract import monitoring
from sparkfleet.fleet.metrics import CappedGetError, capped_get

MAX_BYTES = 4 * 1024 * 1024  # ~20k (user, model) series; the Lua file caps them at 10k
MAX_LABEL = 255  # a user name or a served model name is at most this long
PER_MODEL = ("requests", "errors", "prompt_tokens", "completion_tokens")
PER_USER = ("bytes_in", "bytes_out", "in_flight", "limited")
_LABEL = r'"((?:[^"\\\n]|\\[\\"n])*)"'
_SAMPLE = re.compile(rf'(?P<name>[a-z_]+)\{{user={_LABEL}(?:,model={_LABEL})?\}} (?P<value>[0-9]+(?:\.[0-9]+)?)')
_UNESCAPE = re.compile(r"\\(.)")


class UsageError(ValueError):
    """A front door's usage answer is not what the Lua file writes (the line number says where)."""


def field_of(metric: str) -> str:
    """sparkfleet_user_requests_total -> requests (a USAGE_METRICS name to its field)."""
    return metric.removeprefix("sparkfleet_user_").removesuffix("_total")


FIELDS = {name: field_of(name) for name in monitoring.USAGE_METRICS}


def _label(raw: str) -> str:
    value = _UNESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), raw)
    if len(value) > MAX_LABEL or not value.isprintable():
        raise ValueError("a label value that no user or model name could be")
    return value


def parse_usage(text: str) -> dict[str, dict]:
    """/usage/metrics -> {user: {per-user fields, "models": {model: per-model fields}}}; UsageError on any line
    that is neither a comment nor a sample of a known name with the labels that name takes."""
    if len(text) > MAX_BYTES:
        raise UsageError(f"longer than {MAX_BYTES} bytes")
    users: dict[str, dict] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line or line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        found = _SAMPLE.fullmatch(line)
        field = FIELDS.get(found.group("name")) if found else None
        try:
            if field is None or (found.group(3) is None) != (field in PER_USER):
                raise ValueError("not a usage sample")
            user, value = _label(found.group(2)), float(found.group("value"))
            model = None if found.group(3) is None else _label(found.group(3))
        except ValueError as exc:
            raise UsageError(f"line {n}: {exc}") from None
        if not math.isfinite(value):
            raise UsageError(f"line {n}: not a finite count")
        row = users.setdefault(user, empty_user())
        if model is None:
            row[field] += int(value)
        else:
            counts = row["models"].setdefault(model, dict.fromkeys(PER_MODEL, 0))
            counts[field] += int(value)
            row[field] += int(value)
    return users


def empty_user() -> dict:
    return {**dict.fromkeys(PER_MODEL + PER_USER, 0), "models": {}}


# The per-user fields of the usage stick table that HAProxy's peers copy to every door (two or more doors share
# the table: roles/front_door/address.py): each door holds the same count, so it is counted once (the highest);
# in_flight (conn_cur) stays each door's own and is summed, as the Lua file's counts are (each door counts the
# requests it passed: the doors' sum).
SHARED = ("bytes_in", "bytes_out", "limited")


def merged(doors: list[dict[str, dict]], shared_table: bool = False) -> dict[str, dict]:
    """The usage of several front doors (each parse_usage's) summed per user and model; with `shared_table` (the
    doors' peers share the stick table) the SHARED fields are the highest door's, not the sum."""
    out: dict[str, dict] = {}
    for door in doors:
        for user, row in door.items():
            into = out.setdefault(user, empty_user())
            for field in PER_MODEL + PER_USER:
                if shared_table and field in SHARED:
                    into[field] = max(into[field], row[field])
                else:
                    into[field] += row[field]
            for model, counts in row["models"].items():
                mine = into["models"].setdefault(model, dict.fromkeys(PER_MODEL, 0))
                for field in PER_MODEL:
                    mine[field] += counts[field]
    return out


def door_usage(url: str, api_key: str | None, verify=True, timeout_s: float = 10) -> dict[str, dict]:
    """One front door's usage, asked at `url` with the backend key; UsageError when it does not answer 200 or
    answers more than MAX_BYTES or something parse_usage refuses."""
    try:
        body = capped_get(url + monitoring.USAGE_METRICS_PATH, MAX_BYTES, timeout_s,
                          headers={"Authorization": f"Bearer {api_key}"}, verify=verify)
    except CappedGetError as exc:
        hint = " (401: not the engines' api_key)" if "HTTP 401" in str(exc) else ""
        raise UsageError(f"{exc}{hint}") from None
    try:
        return parse_usage(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise UsageError("answered bytes that are not UTF-8") from None


def fleet_usage(inventory: str) -> dict:
    """Every front door's usage, merged: {"doors": [{"host", "url", "ok", "problem"}], "users": {...}}."""
    from sparkfleet.contract.settings import parse_settings
    from sparkfleet.contract.monitoring import FRONT_DOOR_GROUP
    from sparkfleet.contract.reach import front_door_url
    from sparkfleet.controller.inventory import group_hosts
    from sparkfleet.refused import Refused

    hosts = group_hosts(inventory, FRONT_DOOR_GROUP)
    if not hosts:
        raise Refused(f"no `{FRONT_DOOR_GROUP}` group in {inventory}: usage is counted at the front door; add one "
                      "(see inventory/office_front_door.py)")
    doors, found = [], []
    for name, data in hosts:
        s = parse_settings(name, data)
        url = front_door_url(name, s, data)
        try:
            found.append(door_usage(url, s.api_key, verify=s.controller_front_door_ca or True))
            doors.append({"host": name, "url": url, "ok": True, "problem": None})
        except UsageError as exc:
            doors.append({"host": name, "url": url, "ok": False, "problem": str(exc)})
    return {"doors": doors, "users": merged(found, shared_table=len(hosts) > 1)}


def usage_rows(users: dict[str, dict]) -> list[tuple[str, ...]]:
    """The table: one row per user (totals), then one per model of theirs (indented); names are text, never
    markup."""
    from sparkfleet.tables import literal

    rows = []
    for user, row in sorted(users.items()):
        rows.append((literal(user), "all", *(str(row[f]) for f in COLUMNS)))
        for model, counts in sorted(row["models"].items()):
            rows.append(("", literal(model), *(str(counts[f]) if f in counts else "" for f in COLUMNS)))
    return rows


COLUMNS = ("requests", "errors", "bytes_in", "bytes_out", "in_flight", "prompt_tokens", "completion_tokens",
           "limited")
HEADERS = ("user", "model", "requests", "errors", "bytes in", "bytes out", "in flight", "prompt tokens",
           "completion tokens", "limited")
