"""Test tiers: the markers of tests that run a real program of this machine (HAProxy, Prometheus, Chromium...).

A test that runs one says so with its marker (`@pytest.mark.haproxy`); a fixture that starts one says so with
`@needs("haproxy")` (under its `@pytest.fixture`), and every test using that fixture, directly or through another,
carries the marker too. tests/conftest.py's one hook (`pytest_collection_modifyitems`) does both before `-m`
selects: `-m "not haproxy"` leaves them out, and where the program is missing each is skipped with one reason
naming the Debian package that brings it (`sim/bootstrap.sh` installs them all). docs/development.md, "Test tiers".
`--lane fast` keeps the tests of no tier (`make fast`), `--lane programs` the others (`make test` runs both).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from functools import cache


@dataclass(frozen=True)
class Tool:
    programs: tuple[tuple[str, ...], ...]  # each one needed, under any of its names
    package: str  # the Debian package that brings them
    what: str  # what the tests do with it

    def missing(self) -> list[str]:
        return [names[0] for names in self.programs if not any(shutil.which(n) for n in names)]


# marker -> the programs its tests run; the markers are declared in pyproject.toml ([tool.pytest.ini_options])
TOOLS = {
    "haproxy": Tool((("haproxy",),), "haproxy", "the real front door and guard on loopback"),
    "prometheus": Tool((("prometheus",), ("promtool",)), "prometheus",
                       "the real Prometheus, promtool's checks of the config and the alert rules"),
    "node_exporter": Tool((("prometheus-node-exporter",),), "prometheus-node-exporter",
                          "the node exporter's metric names"),
    "chromium": Tool((("chromium", "chromium-browser"),), "chromium", "the status page's screenshot"),
    "keepalived": Tool((("keepalived",),), "keepalived", "keepalived's own check of the floating address's config"),
    "ssh": Tool((("ssh",),), "openssh-client", "the real OpenSSH client against hostile loopback ports"),
    "restic": Tool((("restic",),), "restic", "the real restic against a local repository (backups)"),
}
_ATTRIBUTE = "sparkfleet_tiers"


def needs(*markers: str):
    """A fixture's tiers: every test that uses the fixture gets these markers (see tests/conftest.py)."""
    unknown = set(markers) - set(TOOLS)
    if unknown:
        raise ValueError(f"unknown test tier(s) {sorted(unknown)}: one of {sorted(TOOLS)}")

    def mark(function):
        setattr(function, _ATTRIBUTE, (*getattr(function, _ATTRIBUTE, ()), *markers))
        return function
    return mark


def fixture_tiers(item) -> set[str]:
    """The tiers of the fixtures an item uses, itself or through the fixtures it uses (their closure)."""
    info = getattr(item, "_fixtureinfo", None)  # pytest's FuncFixtureInfo: the fixtures each name resolves to
    if info is None:
        return set()
    found = set()
    for name in info.names_closure:
        for definition in info.name2fixturedefs.get(name, ()):
            found.update(getattr(definition.func, _ATTRIBUTE, ()))
    return found


@cache
def skip_reason(marker: str) -> str | None:
    """Why a test of this tier cannot run here (None: it can)."""
    tool = TOOLS[marker]
    missing = tool.missing()
    if not missing:
        return None
    return (f"needs {', '.join(missing)} ({tool.what}): apt-get install {tool.package} "
            f"(sim/bootstrap.sh installs it); or leave the tier out: -m 'not {marker}'")


# `make fast` runs the tests of no tier; `make test` runs them, then the others (scripts/test.sh)
LANES = ("fast", "programs")


def runs_a_program(item) -> bool:
    """Whether the item carries a tier's marker (after mark_and_skip: its fixtures' tiers too)."""
    return any(item.get_closest_marker(marker) is not None for marker in TOOLS)


def split_lane(items, lane: str) -> tuple[list, list]:
    """(the items of `lane`, the others): "fast" the items that run no program, "programs" those that do."""
    if lane not in LANES:
        raise ValueError(f"unknown lane {lane!r}: one of {', '.join(LANES)}")
    kept, other = [], []
    for item in items:
        (kept if runs_a_program(item) == (lane == "programs") else other).append(item)
    return kept, other


def mark_and_skip(items) -> None:
    """Each item gets the markers of its fixtures' tiers, and a skip where a tier's program is missing."""
    import pytest

    for item in items:
        for marker in sorted(fixture_tiers(item)):
            if item.get_closest_marker(marker) is None:
                item.add_marker(getattr(pytest.mark, marker))
        reasons = [reason for marker in TOOLS if item.get_closest_marker(marker) is not None
                   and (reason := skip_reason(marker))]
        if reasons:
            item.add_marker(pytest.mark.skip(reason="; ".join(reasons)))
