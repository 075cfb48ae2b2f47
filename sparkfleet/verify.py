"""Decide, on the controller, which model files a host must still fetch or hash."""

from __future__ import annotations

from sparkfleet.model.manifest import Manifest


def files_needing_work(manifest: Manifest, record: dict, files: dict, full_verify: bool = False) -> list[str]:
    """Paths whose bytes the verified record does not vouch for (absent, changed, or unrecorded).

    The record is written by sparkfleet-fetch after hashing; a file counts as
    verified while its size, mtime and inode are those it had when hashed.
    """
    if full_verify:
        return [f.path for f in manifest.files]
    needed = []
    for entry in manifest.files:
        expected = entry.sha256 or entry.blob_sha1
        have, stat = record.get(entry.path), files.get(entry.path)
        if stat is None or have is None or stat["size"] != entry.size or have != {**stat, "hash": expected}:
            needed.append(entry.path)
    return needed


def missing_bytes(manifest: Manifest, needed: list[str]) -> int:
    """Bytes still to download: what the free-disk check must cover."""
    wanted = set(needed)
    return sum(f.size for f in manifest.files if f.path in wanted)
