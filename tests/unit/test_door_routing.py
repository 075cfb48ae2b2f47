"""The front door's routing (issue 54): front_door_routing picks bounded affinity (the default), today's unbounded
affinity or round robin; servers carry ids from their names, so two doors map a key alike. Config checks here;
the real HAProxy behind loopback engines in test_door_failover.py."""

from __future__ import annotations

import pytest

from sparkfleet.contract.settings import SettingsError
from sparkfleet.roles.front_door import plan as fd_plan

from .test_front_door import plans

THREE = {"spark-a": {}, "spark-b": {}, "spark-c": {}}


def engines_block(config: str) -> str:
    return config.split("\nbackend engines\n")[1].split("\nbackend ")[0]


def test_bounded_is_the_default_and_keys_on_the_person_and_the_first_message():
    block = engines_block(fd_plan.front_door_plan("spark-a", plans(**THREE)).config())
    assert "balance hash var(txn.conversation)" in block and "hash-type consistent" in block
    assert f"hash-balance-factor {fd_plan.HASH_BALANCE_FACTOR}" in block and fd_plan.HASH_BALANCE_FACTOR == 175
    assert 'set-var-fmt(txn.conversation) "%[var(txn.user)]/%[var(txn.first)]/%[var(txn.reply1)]"' in block
    assert "roundrobin" not in block


def test_hash_is_the_unbounded_first_message_and_roundrobin_has_no_key():
    hashed = engines_block(fd_plan.front_door_plan("spark-a", plans(**{
        n: {"front_door_routing": "hash"} for n in THREE})).config())
    assert "http-request set-var(txn.conversation) var(txn.first)" in hashed
    assert "hash-balance-factor" not in hashed and "txn.user" not in hashed
    rr = engines_block(fd_plan.front_door_plan("spark-a", plans(**{
        n: {"front_door_routing": "roundrobin"} for n in THREE})).config())
    assert "balance roundrobin" in rr and "balance hash" not in rr and "txn.conversation" not in rr


def test_an_unknown_routing_is_refused():
    with pytest.raises(SettingsError, match="front_door_routing"):
        plans(**{"spark-a": {"front_door_routing": "random"}})


def test_server_ids_come_from_names_alone():
    """Two doors, or one door after a host joined, give each server the same id: the ring does not move."""
    two = fd_plan.front_door_plan("spark-a", plans(**{"spark-a": {}, "spark-c": {}})).config()
    three = fd_plan.front_door_plan("spark-b", plans(**THREE)).config()
    for name in ("spark-a", "spark-c"):
        line = f" id {fd_plan.server_id(name)}\n"
        assert line in engines_block(two) and line in engines_block(three)
    assert len({fd_plan.server_id(n) for n in THREE}) == 3
    assert all(1 <= fd_plan.server_id(n) <= 1 << 30 for n in THREE)
