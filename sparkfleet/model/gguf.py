"""GGUF models: which file a server loads, and (from the file's own header) the facts the memory planner needs.

A GGUF model is one file, or a split `NAME-0000N-of-0000M.gguf` set that llama.cpp loads from its first part.
"""

from __future__ import annotations

import re

SPLIT = re.compile(r"(?P<stem>.+)-(?P<part>[0-9]{5})-of-(?P<parts>[0-9]{5})\.gguf")


def is_gguf(path: str) -> bool:
    return path.endswith(".gguf")


def entry_file(paths: list[str]) -> str | None:
    """The file llama.cpp is given (`-m`): the only .gguf, or the first part of a split set; None when the
    files hold no GGUF model (ValueError when they hold more than one: narrow them with `model_files`)."""
    ggufs = sorted(p for p in paths if is_gguf(p))
    firsts = [p for p in ggufs if not SPLIT.fullmatch(p.rsplit("/", 1)[-1])
              or SPLIT.fullmatch(p.rsplit("/", 1)[-1])["part"] == "00001"]
    if not firsts:
        return None
    if len(firsts) > 1:
        raise ValueError(f"the files hold {len(firsts)} GGUF models ({', '.join(firsts[:4])}): set `model_files` "
                         "to the one to serve, e.g. [\"*Q4_K_M*.gguf\"]")
    return firsts[0]
