"""The test tiers (tests/tiers.py, tests/conftest.py's hook): a fixture's tier reaches every test that uses it,
a missing program skips with the package that brings it, and every tier is a declared marker."""

from __future__ import annotations

import pytest

from tests import tiers
from tests.tiers import needs


@pytest.fixture
@needs("node_exporter")
def exporter_tier():
    return "started"


@pytest.fixture
def through_another(exporter_tier):
    return exporter_tier


def test_a_fixtures_tier_reaches_the_tests_that_use_it_through_other_fixtures(request, through_another):
    assert request.node.get_closest_marker("node_exporter") is not None
    assert request.node.get_closest_marker("haproxy") is None


def test_a_missing_program_skips_naming_its_package(monkeypatch):
    monkeypatch.setattr(tiers.shutil, "which", lambda name: None if name == "promtool" else f"/usr/bin/{name}")
    tiers.skip_reason.cache_clear()
    try:
        reason = tiers.skip_reason("prometheus")
        assert reason.startswith("needs promtool (") and "apt-get install prometheus " in reason
        assert "sim/bootstrap.sh" in reason and "-m 'not prometheus'" in reason
        assert tiers.skip_reason("haproxy") is None
    finally:
        tiers.skip_reason.cache_clear()


def test_any_of_a_programs_names_will_do(monkeypatch):
    monkeypatch.setattr(tiers.shutil, "which", lambda name: "/usr/bin/chromium-browser"
                        if name == "chromium-browser" else None)
    assert tiers.TOOLS["chromium"].missing() == []


def test_an_unknown_tier_is_refused():
    with pytest.raises(ValueError, match="unknown test tier"):
        needs("haproxi")


def test_every_tier_is_a_declared_marker(pytestconfig):
    declared = {line.split(":", 1)[0].strip() for line in pytestconfig.getini("markers")}
    assert set(tiers.TOOLS) <= declared


class _Item:
    def __init__(self, *markers: str):
        self.markers = markers

    def get_closest_marker(self, name):
        return name if name in self.markers else None


def test_the_lanes_split_the_tests_by_tier():
    """`--lane fast` (make fast) keeps the tests of no tier, `--lane programs` the others: each test in one lane."""
    plain, door, page = _Item(), _Item("haproxy"), _Item("prometheus", "chromium")
    assert tiers.split_lane([plain, door, page], "fast") == ([plain], [door, page])
    assert tiers.split_lane([plain, door, page], "programs") == ([door, page], [plain])
    with pytest.raises(ValueError, match="unknown lane"):
        tiers.split_lane([plain], "slow")
