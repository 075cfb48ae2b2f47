"""The model manifest: every file of a model at one revision, with its hash.

Trust comes from the hub's hashes: sha256 for LFS files (and for every file
on ModelScope), the git blob sha1 for small Hugging Face files. Everything
else the hub says is data: a commit id or a path that could climb out of the
model directory refuses the manifest (UntrustedAnswer), with the host
module's rules (the hosts re-check with the same code).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from functools import cached_property

from sparkfleet.contract.shared import verify
from sparkfleet.model import gguf

COMMIT_RE = verify.COMMIT_RE
UntrustedAnswer = verify.UntrustedAnswer
git_blob_sha1 = verify.git_blob_sha1
_HEX = {"sha256": re.compile(r"[0-9a-f]{64}"), "blob_sha1": re.compile(r"[0-9a-f]{40}")}


@dataclass(frozen=True)
class ManifestFile:
    path: str
    size: int
    sha256: str | None = None
    blob_sha1: str | None = None

    def __post_init__(self):
        verify.check_manifest_path(self.path)
        if not (self.sha256 or self.blob_sha1):
            raise UntrustedAnswer(f"{self.path!r}: the hub gave no hash for this file; it cannot be verified")
        for kind, pattern in _HEX.items():
            value = getattr(self, kind)
            if value is not None and not (isinstance(value, str) and pattern.fullmatch(value)):
                raise UntrustedAnswer(f"{self.path!r}: {kind} {value!r} is not a hex digest")
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 0:
            raise UntrustedAnswer(f"{self.path!r}: size {self.size!r} is not a byte count")


@dataclass(frozen=True)
class Manifest:
    hub: str
    repo: str
    revision: str  # what the settings asked for (branch, tag or commit)
    commit: str | None  # what it resolved to, when the hub says
    files: tuple[ManifestFile, ...] = field(default_factory=tuple)
    selection: tuple[str, ...] | None = None  # the `model_files` globs these files are (None: the repo's all)

    def __post_init__(self):
        verify.check_commit(self.commit)
        verify.check_manifest_paths(f.path for f in self.files)
        verify.check_dir_name(self.dir_name)

    @cached_property
    def entries(self) -> dict[str, dict]:
        """path -> entry as the host module reads it (the fetch job's `files`, keyed)."""
        return {f.path: asdict(f) for f in self.files}

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def weight_bytes(self) -> int:
        """What a server loads: the .gguf files when there are any, else the .safetensors, else every file."""
        for suffix in (".gguf", ".safetensors"):
            found = sum(f.size for f in self.files if f.path.endswith(suffix))
            if found:
                return found
        return self.total_bytes

    @property
    def digest(self) -> str:
        """Content address of the file list: same files and hashes, same digest."""
        body = json.dumps([asdict(f) for f in sorted(self.files, key=lambda f: f.path)], sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()

    @property
    def pin(self) -> str:
        """The commit when known, else the content digest: never a moving branch name."""
        return self.commit or f"sha256-{self.digest[:16]}"

    @property
    def dir_name(self) -> str:
        """repo@pin; a selection of the files (`model_files`) has its own directory, so that releases choosing
        other files of one commit never remove each other's."""
        name = f"{self.repo.replace('/', '--')}@{self.pin[:16]}"
        return f"{name}-{self.digest[:8]}" if self.selection is not None else name

    def to_dict(self) -> dict:
        return {
            "hub": self.hub,
            "repo": self.repo,
            "revision": self.revision,
            "commit": self.commit,
            "digest": self.digest,
            "files": [asdict(f) for f in self.files],
        } | ({"selection": list(self.selection)} if self.selection is not None else {})

    @classmethod
    def from_dict(cls, data: dict) -> Manifest:
        return cls(
            hub=data["hub"],
            repo=data["repo"],
            revision=data["revision"],
            commit=data.get("commit"),
            files=tuple(ManifestFile(**f) for f in data["files"]),
            selection=tuple(data["selection"]) if data.get("selection") is not None else None,
        )

    def summary(self) -> dict:
        """to_dict without the file list: what plans and release records show."""
        return {**self.to_dict(), "files": len(self.files), "bytes": self.total_bytes}


def selected(manifest: Manifest, globs: list[str] | None) -> Manifest:
    """The manifest of the files matching `globs` (fnmatch on the repository path; None: every file, the manifest
    itself): what the plan, the lock, the fetch job and the verify all read. ValueError, one line naming the fix,
    when a glob matches no file or the files keep only some parts of a split GGUF set."""
    if globs is None:
        return manifest
    where = f"{manifest.hub}:{manifest.repo}@{manifest.revision}"
    paths = [f.path for f in manifest.files]
    for glob in globs:
        if not any(fnmatch.fnmatchcase(p, glob) for p in paths):
            ggufs = [p for p in paths if gguf.is_gguf(p)]
            examples = ggufs or paths
            raise ValueError(
                f"model_files {glob!r} matches no file of {where} (its {'.gguf ' if ggufs else ''}files: "
                f"{', '.join(examples[:5])}{', ...' if len(examples) > 5 else ''}): fix the glob (fnmatch, "
                f"case-sensitive)")
    files = tuple(f for f in manifest.files if any(fnmatch.fnmatchcase(f.path, g) for g in globs))
    chosen = {f.path for f in files}
    for path in sorted(chosen):
        split = gguf.SPLIT.fullmatch(path.rsplit("/", 1)[-1])
        if split:
            parts = int(split["parts"])
            base = path[:len(path) - len(path.rsplit("/", 1)[-1])] + split["stem"]
            lacking = [f"{base}-{n:05d}-of-{parts:05d}.gguf" for n in range(1, parts + 1)]
            lacking = [p for p in lacking if p not in chosen]
            if lacking:
                raise ValueError(f"model_files {list(globs)} keep {path} of a split GGUF set but not "
                                 f"{', '.join(lacking[:3])}: match every part, e.g. \"{split['stem']}-*.gguf\"")
    return dataclasses.replace(manifest, files=files, selection=tuple(globs))


def model_dir(model_root: str, repo: str, manifest: Manifest | None) -> str:
    """Where a model lives on a host: its pinned directory, or a placeholder until the hub resolves it."""
    pin = manifest.dir_name if manifest else f"{repo.replace('/', '--')}@unresolved"
    return f"{model_root}/{pin}"
