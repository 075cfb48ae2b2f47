"""What vouches for a model directory's files, and what a hub's answer may name.

The verified record (its name and format: path -> {size, mtime_ns, ino, hash}), when it vouches for a file, which
manifest files need work and which entries are extras, the file hashes (sha256, else the git blob sha1), and the
checks a hub's (or a peer's) answer passes before it names a path: commit ids, manifest paths, a directory name,
a path resolved under its root. Hub answers are data: anything that would make them a path outside the model
directory is refused. Written by sparkfleet-fetch, read by sparkfleet-share, the controller's planner and copy,
and `status`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import unicodedata
from pathlib import Path

RECORD_NAME = ".sparkfleet-verified.json"  # inside each model directory: path -> {size, mtime_ns, ino, hash}
RECORD_TMP_NAME = RECORD_NAME + ".partial"  # written, then renamed over the record
STAGING_NAME = ".staging"  # under the model root: same file system, atomic rename
PART_SUFFIX = ".part"  # a transfer in progress, inside staging
RESERVED_NAMES = frozenset({RECORD_NAME, RECORD_TMP_NAME, STAGING_NAME})
COMMIT_RE = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # git sha1 or sha256 object ids
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# What a manifest path may not hold: a control (C0, DEL, C1), a format character (a bidi override makes
# "a\u202egnp.exe" read "aexe.png"), a line or paragraph separator, a lone surrogate.
_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_CHUNK = 1 << 20


class UntrustedAnswer(ValueError):
    """A hub's (or a peer's) answer that cannot be used as it stands; the message says why."""


def check_commit(commit: str | None) -> str | None:
    """A commit id as a hub reports it: 40 or 64 lowercase hex characters (or no commit at all)."""
    if commit is not None and not (isinstance(commit, str) and COMMIT_RE.fullmatch(commit)):
        raise UntrustedAnswer(f"commit id {commit!r} is not 40 or 64 hex characters")
    return commit


def check_manifest_path(path: str) -> str:
    """A manifest path that names a file inside the model directory, and nothing else."""
    if not isinstance(path, str) or not path:
        raise UntrustedAnswer(f"manifest path {path!r} is empty")
    if "\\" in path or any(unicodedata.category(c) in _HIDDEN for c in path):
        raise UntrustedAnswer(f"manifest path {path!r} holds a control, format (bidi) or separator character, "
                              f"or a backslash")
    if path.startswith("/"):
        raise UntrustedAnswer(f"manifest path {path!r} is absolute")
    parts = path.split("/")
    if any(part.strip(".") == "" for part in parts):
        raise UntrustedAnswer(f"manifest path {path!r} is not normalised (empty, '.' or '..' parts)")
    if RESERVED_NAMES.intersection(parts) or path.endswith(PART_SUFFIX):
        raise UntrustedAnswer(f"manifest path {path!r} collides with sparkfleet's own record or staging names")
    return path


def check_manifest_paths(paths) -> list[str]:
    """Every path checked, no duplicates, and no file that is also another file's directory."""
    paths = [check_manifest_path(p) for p in paths]
    seen = set(paths)
    if len(seen) != len(paths):
        raise UntrustedAnswer("the manifest lists a path twice")
    for path in paths:
        for i in range(1, path.count("/") + 1):
            if path.rsplit("/", i)[0] in seen:
                raise UntrustedAnswer(f"manifest path {path!r} lies under another listed file")
    return paths


def check_dir_name(name: str) -> str:
    """One path component (a model directory's name): nothing that climbs or splits."""
    if not name or "/" in name or name.strip(".") == "" or _CONTROL.search(name) or name in RESERVED_NAMES:
        raise UntrustedAnswer(f"directory name {name!r} is not a single plain path component")
    return name


def inside(root, path) -> Path:
    """`path` with every symlink resolved, provided it stays under `root` (also resolved)."""
    resolved, base = Path(path).resolve(), Path(root).resolve()
    if not resolved.is_relative_to(base):
        raise UntrustedAnswer(f"{path} resolves to {resolved}, outside {base}")
    return resolved


def expected_hash(entry: dict) -> str:
    """The hash a manifest entry pins: sha256 when the hub gives one, else the git blob sha1."""
    return entry.get("sha256") or entry["blob_sha1"]


def git_blob_sha1(data: bytes) -> str:
    """The id git (and the Hugging Face hub) gives a small file."""
    digest = hashlib.sha1(b"blob %d\0" % len(data))
    digest.update(data)
    return digest.hexdigest()


def hash_file(f, entry: dict) -> str:
    """The digest of an open file in the kind the entry pins (sha256, else git blob sha1)."""
    if entry.get("sha256"):
        digest = hashlib.sha256()
    else:
        digest = hashlib.sha1(b"blob %d\0" % os.fstat(f.fileno()).st_size)
    while chunk := f.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def file_matches(path, entry: dict) -> bool:
    """True when the file has the entry's size and hash (size first: no read when it differs)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if os.fstat(f.fileno()).st_size != entry["size"]:
            return False
        return hash_file(f, entry) == expected_hash(entry)


def stat_key(st: os.stat_result) -> dict:
    """What the record keeps of a file's stat: a change to any of them voids the vouch."""
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


def record_entry(st: os.stat_result, entry: dict) -> dict:
    return {**stat_key(st), "hash": expected_hash(entry)}


def vouches(have: dict | None, current: dict | None, entry: dict | None = None) -> bool:
    """Does a record entry vouch for a file whose stat is `current` (and, given the entry, its hash)?"""
    if not have or not current:
        return False
    if any(have.get(k) != current.get(k) for k in ("size", "mtime_ns", "ino")):
        return False
    return entry is None or (current["size"] == entry["size"] and have.get("hash") == expected_hash(entry))


def files_needing_work(entries: dict, record: dict, files: dict, full_verify: bool = False) -> list[str]:
    """Manifest paths the record does not vouch for (absent, changed, or unrecorded), in manifest order.

    `entries` maps path -> manifest entry; `files` maps path -> stat_key of
    each regular file found (the ModelFiles fact, or scan()).
    """
    if full_verify:
        return list(entries)
    return [path for path, entry in entries.items() if not vouches(record.get(path), files.get(path), entry)]


def extras(entries, files: dict, others: dict) -> list[str]:
    """Entries of a model directory that the manifest does not name: files, symlinks, other directories.

    `others` maps path -> find's type letter (d, l, p, s, ...) of every
    non-regular entry. Directories that hold manifest files are expected.
    """
    wanted = set(entries)
    parents = {path.rsplit("/", i)[0] for path in wanted for i in range(1, path.count("/") + 1)}
    found = [p for p in files if p not in wanted and p != RECORD_NAME]
    found += [p for p, kind in others.items() if not (kind == "d" and p in parents)]
    return sorted(found)


_TYPES = {stat.S_IFDIR: "d", stat.S_IFLNK: "l", stat.S_IFIFO: "p", stat.S_IFSOCK: "s",
          stat.S_IFCHR: "c", stat.S_IFBLK: "b"}


def scan(model_dir) -> tuple[dict, dict]:
    """(regular files -> stat_key, other entries -> type letter) under model_dir, symlinks never followed."""
    files, others = {}, {}
    root = str(model_dir)
    for top, dirs, names in os.walk(root):
        for name in dirs + names:
            full = os.path.join(top, name)
            rel = os.path.relpath(full, root)
            st = os.lstat(full)
            if stat.S_ISREG(st.st_mode):
                files[rel] = stat_key(st)
            else:
                others[rel] = _TYPES.get(stat.S_IFMT(st.st_mode), "?")
    files.pop(RECORD_NAME, None)
    return files, others


def open_beneath(root, parts) -> int:
    """A read-only fd for root/parts..., following no symlink among `parts` (else OSError)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_NONBLOCK if last else os.O_DIRECTORY)
            fd, parent = os.open(part, flags, dir_fd=fd), fd
            os.close(parent)
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_record(model_dir) -> dict:
    """The verified record, or {} when there is none (or it is unreadable, or a symlink: then nothing is vouched
    for)."""
    model_dir = Path(model_dir)
    try:
        with os.fdopen(open_beneath(model_dir.parent, [model_dir.name, RECORD_NAME]), "rb") as f:
            record = json.loads(f.read())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def write_record(model_dir, verified: dict) -> None:
    """Replace the record atomically (world-readable: the unprivileged share reads it)."""
    tmp = Path(model_dir) / RECORD_TMP_NAME
    tmp.write_text(json.dumps(verified, indent=0, sort_keys=True))
    os.chmod(tmp, 0o644)
    os.replace(tmp, Path(model_dir) / RECORD_NAME)
