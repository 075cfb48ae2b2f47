"""A GGUF header is parsed under one budget (issue 36, item 4): each count was bounded, not their product, so a
16 MiB header of 4,096-item arrays took 5.7 s and 127 MiB, and the resolver parsed again from byte 0 at each
larger prefix and again at every `plan`. Now the items and bytes of the whole header share one budget, the parse
goes on from where the last range ended, and a refused header is remembered by its pin."""

from __future__ import annotations

import struct
import time
import tracemalloc

import pytest

from sparkfleet.model import gguf, hubs
from sparkfleet.model.hubs import HubError
from sparkfleet.model.manifest import Manifest, ManifestFile

HEADER_BYTES = 16 * 2**20
UINT32, STRING = 4, 8


def array_kv(i: int, item_type: int, items: bytes, count: int) -> bytes:
    key = f"hostile.key{i:06d}".encode()
    return struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, item_type, count) + items


def hostile(item_type: int, count: int, item: bytes, size: int = HEADER_BYTES) -> bytes:
    """`size` bytes of a header whose keys are each an array of `count` items: the most arrays that fit."""
    one = len(array_kv(0, item_type, item * count, count))
    n = size // one
    return (b"GGUF" + struct.pack("<IQQ", 3, 0, n)
            + b"".join(array_kv(i, item_type, item * count, count) for i in range(n)))


def reader(data: bytes, asked: list):
    def read(path: str, start: int, stop: int) -> bytes:
        asked.append((start, stop))
        return data[start:stop]
    return read


@pytest.mark.parametrize("item_type,count,item", [
    (UINT32, gguf.KEPT_ARRAY_ITEMS, struct.pack("<I", 7)),  # the issue's: kept arrays, each item an object
    (STRING, gguf.KEPT_ARRAY_ITEMS, struct.pack("<Q", 0)),  # kept arrays of empty strings
    (STRING, gguf.KEPT_ARRAY_ITEMS + 1, struct.pack("<Q", 0)),  # stepped-over arrays of empty strings
], ids=["uint32", "strings", "skipped-strings"])
def test_a_header_of_many_4096_item_arrays_is_refused_within_a_second_and_little_memory(item_type, count, item):
    data, asked = hostile(item_type, count, item), []
    began = time.process_time()  # timed without tracemalloc, which slows every allocation
    with pytest.raises(gguf.GGUFError, match="budget") as caught:
        hubs.read_gguf_header(reader(data, asked), "x.gguf", len(data))
    took = time.process_time() - began
    tracemalloc.start()
    try:
        with pytest.raises(gguf.GGUFError, match="budget"):
            hubs.read_gguf_header(reader(data, asked), "x.gguf", len(data))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert took < 1.0, f"{took:.2f} s of CPU"
    assert peak < 64 * 2**20, f"{peak / 2**20:.0f} MiB"
    assert "\n" not in str(caught.value)


def test_the_parse_goes_on_from_where_the_last_range_ended(monkeypatch):
    """A header longer than the first read: each byte is asked of the hub once, and parsed once."""
    monkeypatch.setattr(hubs, "GGUF_FIRST_READ", 4096)
    data = hostile(UINT32, gguf.KEPT_ARRAY_ITEMS + 1, struct.pack("<I", 7), size=600_000)  # skipped arrays
    asked, parses = [], []
    real = gguf._Cursor.__init__

    def cursor(self, *args, **kwargs):  # one cursor a parse: a restart from byte 0 is a second one
        parses.append(args)
        real(self, *args, **kwargs)
    monkeypatch.setattr(gguf._Cursor, "__init__", cursor)
    header = hubs.read_gguf_header(reader(data, asked), "x.gguf", len(data))
    assert header.kv_end == len(data) and len(asked) >= 3
    assert [start for start, _ in asked] == [0] + [stop for _, stop in asked[:-1]]  # contiguous, none twice
    assert len(parses) == 1


def test_a_refused_header_is_remembered_by_its_pin_and_the_hub_is_not_asked_again(monkeypatch):
    data, asked = hostile(UINT32, gguf.KEPT_ARRAY_ITEMS, struct.pack("<I", 7), size=2 * 2**20), []
    monkeypatch.setattr(hubs, "_RANGES", {"huggingface": lambda m, e, t: reader(data, asked)})
    manifest = Manifest("huggingface", "evil/Hostile-GGUF", "main", "c" * 40,
                        (ManifestFile("x.gguf", len(data), sha256="d" * 64),))
    hubs.read_gguf_config.cache_clear()
    with pytest.raises(HubError, match="budget") as first:
        hubs.model_config(manifest, None, None)
    asked_once = len(asked)
    assert asked_once
    hubs.read_gguf_config.cache_clear()  # a new `plan` (a new process): only the disk cache is left
    with pytest.raises(HubError) as second:
        hubs.model_config(manifest, None, None)
    assert len(asked) == asked_once and str(second.value) == str(first.value)
    assert not list((hubs.cache_dir() / "configs").rglob("*.config.json"))  # no config of it
    other = Manifest("huggingface", "evil/Hostile-GGUF", "main", "e" * 40,
                     (ManifestFile("x.gguf", len(data), sha256="d" * 64),))
    hubs.read_gguf_config.cache_clear()
    with pytest.raises(HubError):
        hubs.model_config(other, None, None)  # another commit: asked again
    assert len(asked) > asked_once
