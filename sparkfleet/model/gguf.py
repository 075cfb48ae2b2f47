"""GGUF models: which file a server loads, and (from the file's own header) the facts the memory planner needs.

A GGUF model is one file, or a split `NAME-0000N-of-0000M.gguf` set that llama.cpp loads from its first part.
The first part's header holds the model's metadata: magic `GGUF`, a version (2 or 3: the same layout, 3 adds
big-endian files, which llama.cpp does not load on a Spark and neither do we), the tensor count, the key-value
count, then that many (key, typed value) pairs, all little-endian. The planner reads only that part, through
the hub with Range requests (sparkfleet.model.hubs), so a hub's bytes are data here: every length and count is
bounded before anything is allocated, the whole parse spends from one budget, and a header that breaks a rule is
refused (GGUFError), never trusted.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass

from sparkfleet.contract.engines import serving_format

SPLIT = re.compile(r"(?P<stem>.+)-(?P<part>[0-9]{5})-of-(?P<parts>[0-9]{5})\.gguf")

MAGIC = b"GGUF"
VERSIONS = (2, 3)
# Bounds on what a header may claim (a real model's: a few hundred keys, a vocabulary of ~250k tokens and as
# many merges, a chat template of tens of KiB; the tensor count is only read, never used to allocate).
MAX_KEYS = 65_536
MAX_KEY_BYTES = 65_535  # the GGUF specification's own limit on a key
MAX_STRING_BYTES = 4 * 2**20
MAX_ARRAY_ITEMS = 2**24
MAX_TENSORS = 2**20
MAX_HEADER_BYTES = 128 * 2**20  # the most of a file's first bytes the planner reads for its key-value section
KEPT_ARRAY_ITEMS = 4096  # a longer array (the vocabulary) is kept as its length only
_READERS = " or ".join(d.label for d in serving_format("gguf"))  # the engines that serve GGUF (contract/engines.py)
# One budget for the whole header, past the bounds on each count (their product was unbounded: 4,096-item arrays
# filling 16 MiB took seconds and 127 MiB): keys and array items stepped or kept (a real vocabulary and its
# merges: well under a million), values kept as objects (keys and short arrays: a few thousand), bytes of
# strings decoded (a chat template: tens of KiB); the bytes read are MAX_HEADER_BYTES at most.
MAX_ITEMS = 2**20
MAX_KEPT_ITEMS = 2**16
MAX_KEPT_BYTES = 16 * 2**20
KEY_RE = re.compile(r"[A-Za-z0-9_.\-]+")
ARCH_RE = re.compile(r"[a-z0-9][a-z0-9_.\-]{0,63}")

# value type -> struct format of one scalar (8: string, 9: array are read apart)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_LENGTH = struct.Struct("<Q").unpack_from  # a string's length, read in place


class GGUFError(ValueError):
    """A GGUF header that is not one, or claims more than the bounds allow: one line saying what."""


class Truncated(GGUFError):
    """The bytes end inside the header: `needed` is how many (at least) the key-value section takes."""

    def __init__(self, needed: int):
        super().__init__(f"the header continues past byte {needed:,}")
        self.needed = needed


@dataclass(frozen=True)
class LongArray:
    """An array longer than KEPT_ARRAY_ITEMS, kept as its element type and length (the vocabulary's size)."""
    item_type: int
    count: int

    def __len__(self) -> int:
        return self.count


@dataclass(frozen=True)
class Header:
    version: int
    tensor_count: int
    metadata: dict  # key -> int, float, bool, str, tuple (a short array) or LongArray
    kv_end: int  # the byte offset where the key-value section ends (the tensor infos follow)


def is_gguf(path: str) -> bool:
    return path.endswith(".gguf")


def entry_file(paths: list[str]) -> str | None:
    """The file llama.cpp is given (`-m`): the only .gguf, or the first part of a split set; None when the
    files hold no GGUF model (ValueError when they hold more than one: narrow them with `model_files`)."""
    ggufs = sorted(p for p in paths if is_gguf(p))
    firsts = [p for p in ggufs if (split := SPLIT.fullmatch(p.rsplit("/", 1)[-1])) is None or split["part"] == "00001"]
    if not firsts:
        return None
    if len(firsts) > 1:
        raise ValueError(f"the files hold {len(firsts)} GGUF models ({', '.join(firsts[:4])}): set `model_files` "
                         "to the one to serve, e.g. [\"*Q4_K_M*.gguf\"]")
    return firsts[0]


class _Cursor:
    """The header's bytes from the start, read once: `more(have, needed)` (the resolver's next Range read) gives
    the bytes after the `have` already here, at least up to `needed`; without it, Truncated. Every key, item and
    byte is spent from one budget (the module's MAX_ITEMS, MAX_KEPT_ITEMS, MAX_KEPT_BYTES, MAX_HEADER_BYTES)."""

    def __init__(self, data: bytes, more: Callable[[int, int], bytes] | None = None):
        self.data, self.pos, self.more = bytearray(data), 0, more
        self.items = self.kept = self.kept_bytes = 0

    def need(self, end: int) -> None:
        """The bytes up to `end` are here (fetched when a reader is given), within the header cap."""
        if end > MAX_HEADER_BYTES:
            raise GGUFError(f"the key-value section is longer than {MAX_HEADER_BYTES // 2**20} MiB")
        if end > len(self.data):
            if self.more is None:
                raise Truncated(end)
            self.data += self.more(len(self.data), end)
            if end > len(self.data):
                raise Truncated(end)

    def spend(self, items: int = 0, kept: int = 0, kept_bytes: int = 0) -> None:
        """Count what the header makes this parse do; past the budget it is refused, whatever each count says."""
        self.items, self.kept, self.kept_bytes = self.items + items, self.kept + kept, self.kept_bytes + kept_bytes
        for spent, most, what in ((self.items, MAX_ITEMS, "keys and array items"),
                                  (self.kept, MAX_KEPT_ITEMS, "values kept (keys and short arrays' items)"),
                                  (self.kept_bytes, MAX_KEPT_BYTES, "bytes of strings kept")):
            if spent > most:
                raise GGUFError(f"the header holds more than {most:,} {what}: past sparkfleet's budget for one "
                                f"header (a real model's is far under it)")

    def take(self, n: int) -> bytes:
        self.need(self.pos + n)
        view, self.pos = bytes(self.data[self.pos:self.pos + n]), self.pos + n
        return view

    def skip(self, n: int) -> None:
        """Step over n bytes, fetched but never copied."""
        self.need(self.pos + n)
        self.pos += n

    def scalar(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def count(self, what: str, most: int) -> int:
        n = self.scalar("<Q")
        if n > most:
            raise GGUFError(f"{what} claims {n:,} (at most {most:,})")
        return n

    def string(self, what: str, most: int = MAX_STRING_BYTES) -> str:
        n = self.count(f"{what}'s length", most)
        self.spend(kept_bytes=n)
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"{what} is not UTF-8") from None

    def skip_strings(self, n: int, key: str) -> None:
        """Step over n strings (the vocabulary: ~250k of them) without slicing or decoding one."""
        data, pos = self.data, self.pos
        for _ in range(n):
            if pos + 8 > len(data):  # fetched on (the same bytearray grows), or Truncated / the cap
                self.need(pos + 8)
            length = _LENGTH(data, pos)[0]
            if length > MAX_STRING_BYTES:
                raise GGUFError(f"an item of {key!r}'s length claims {length:,} (at most {MAX_STRING_BYTES:,})")
            pos += 8 + length
        self.need(pos)  # the last string's end
        self.pos = pos

    def value(self, kind: int, key: str):
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string(f"the value of {key!r}")
        if kind == _ARRAY:
            return self.array(key)
        raise GGUFError(f"{key!r} has value type {kind}, which GGUF does not define")

    def array(self, key: str):
        kind = self.scalar("<I")
        if kind == _ARRAY:
            raise GGUFError(f"{key!r} is an array of arrays, which {_READERS} does not read")
        if kind not in _SCALARS and kind != _STRING:
            raise GGUFError(f"{key!r} is an array of value type {kind}, which GGUF does not define")
        n = self.count(f"the array {key!r}", MAX_ARRAY_ITEMS)
        keep = n <= KEPT_ARRAY_ITEMS
        if keep:  # each item becomes an object: spent before one is made
            self.spend(items=n, kept=n)
            read = (lambda: self.string(f"an item of {key!r}")) if kind == _STRING else (
                lambda: self.scalar(_SCALARS[kind]))
            return tuple(read() for _ in range(n))
        if kind == _STRING:  # a step per string
            self.spend(items=n)
            self.skip_strings(n, key)
        else:
            self.skip(n * struct.calcsize(_SCALARS[kind]))  # skipped, bounds-checked, never copied
        return LongArray(kind, n)


def read_header(data: bytes, more: Callable[[int, int], bytes] | None = None) -> Header:
    """The header's key-value section from a file's first bytes; with `more` (see _Cursor) the parse fetches
    the rest as it goes, once, never starting again from byte 0. Truncated when the bytes end inside it and
    there is no `more`, GGUFError when they are not a GGUF header within the bounds and the budget."""
    cur = _Cursor(data, more)
    if cur.take(4) != MAGIC:
        raise GGUFError("the file does not start with the GGUF magic")
    version = cur.scalar("<I")
    if version not in VERSIONS:
        raise GGUFError(f"GGUF version {version} (this reader knows {', '.join(map(str, VERSIONS))})")
    tensors = cur.count("the tensor count", MAX_TENSORS)
    keys = cur.count("the key-value count", MAX_KEYS)
    metadata: dict = {}
    for _ in range(keys):
        cur.spend(items=1, kept=1)
        key = cur.string("a key", MAX_KEY_BYTES)
        if not KEY_RE.fullmatch(key):
            raise GGUFError(f"key {key[:60]!r} is not a dotted name")
        if key in metadata:
            raise GGUFError(f"key {key!r} appears twice")
        metadata[key] = cur.value(cur.scalar("<I"), key)
    return Header(version, tensors, metadata, cur.pos)


# --------------------------------------------------------------------------
# The planner's view: config.json keys from GGUF metadata
# --------------------------------------------------------------------------

# config.json key <- `{arch}.` + GGUF key, as llama.cpp's converter writes them.
_COUNTS = {
    "num_hidden_layers": "block_count",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv",
    "hidden_size": "embedding_length",
    "max_position_embeddings": "context_length",
    "vocab_size": "vocab_size",
    "intermediate_size": "feed_forward_length",
    "num_experts": "expert_count",
    "num_experts_per_tok": "expert_used_count",
    "moe_intermediate_size": "expert_feed_forward_length",
}
# llama.cpp's default KV cache type (-ctk / -ctv f16): 2 bytes a value, which the fit reads as the model dtype.
KV_CACHE_DTYPE = "float16"


def _count(metadata: dict, key: str) -> int | None:
    """An integer key, or the largest of a per-layer array of them (the planner's safe side); None if absent."""
    value = metadata.get(key)
    if value is None:
        return None
    items = value if isinstance(value, tuple) else (value,)
    if not items or not all(type(v) is int for v in items):
        raise GGUFError(f"{key} = {str(value)[:40]} is not a count")
    return max(items)


def planner_config(metadata: dict) -> dict:
    """The config.json-style dict that model/config.py and model/fit.py read, from a GGUF header's metadata.

    Counts are the header's (per-layer arrays: their largest); head_dim is key_length (the mean of key_length
    and value_length when they differ, so 2 x head_dim is still the K plus V width); KV is f16 (llama.cpp's
    default cache type); every layer counts as full attention (a sliding-window layer keeps fewer tokens, so
    the fit is on the safe side). `gguf` marks the config: the fit then reads the bytes per weight from the
    files' size, as a quantized GGUF mixes types tensor by tensor. A recipe of a GGUF model (planned offline)
    writes these keys in its [model.config], with a `[model.config.gguf]` table, so that its roofline reads the
    same bytes per weight.
    """
    arch = metadata.get("general.architecture")
    if not (isinstance(arch, str) and ARCH_RE.fullmatch(arch)):
        raise GGUFError(f"general.architecture = {str(arch)[:40]!r} is not an architecture name")
    config: dict = {"model_type": arch, "architectures": [arch], "torch_dtype": KV_CACHE_DTYPE}
    for ours, theirs in _COUNTS.items():
        value = _count(metadata, f"{arch}.{theirs}")
        if value is not None:
            config[ours] = value
    missing = [f"{arch}.{_COUNTS[k]}" for k in ("num_hidden_layers", "num_attention_heads", "hidden_size",
                                                   "max_position_embeddings") if k not in config]
    if missing:
        raise GGUFError(f"the header lacks {', '.join(missing)}")
    key_length = _count(metadata, f"{arch}.attention.key_length")
    if key_length:
        value_length = _count(metadata, f"{arch}.attention.value_length") or key_length
        config["head_dim"] = -(-(key_length + value_length) // 2)
    if "vocab_size" not in config and "tokenizer.ggml.tokens" in metadata:
        config["vocab_size"] = len(metadata["tokenizer.ggml.tokens"])
    if config.get("num_experts"):
        config.setdefault("moe_intermediate_size", config.get("intermediate_size"))
        shared = _count(metadata, f"{arch}.expert_shared_feed_forward_length")
        if shared:
            config["shared_expert_intermediate_size"] = shared * (_count(metadata, f"{arch}.expert_shared_count")
                                                                  or 1)
    else:
        config.pop("num_experts", None)
    name = metadata.get("general.name")
    config["gguf"] = {"file_type": _count(metadata, "general.file_type"),
                      "name": name[:200] if isinstance(name, str) else None}
    return {k: v for k, v in config.items() if v is not None}


def header_config(data: bytes) -> dict:
    """planner_config of the header in `data` (a file's first bytes)."""
    return planner_config(read_header(data).metadata)
