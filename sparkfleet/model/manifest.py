"""The model manifest: every file of a model at one revision, with its hash.

Trust comes from the hub's hashes: sha256 for LFS files (and for every file
on ModelScope), the git blob sha1 for small Hugging Face files.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field

COMMIT_RE = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class ManifestFile:
    path: str
    size: int
    sha256: str | None = None
    blob_sha1: str | None = None

    def __post_init__(self):
        if not (self.sha256 or self.blob_sha1):
            raise ValueError(f"{self.path}: the hub gave no hash for this file; it cannot be verified")
        if self.path.startswith("/") or ".." in self.path.split("/"):
            raise ValueError(f"{self.path}: refusing a path outside the model directory")


@dataclass(frozen=True)
class Manifest:
    hub: str
    repo: str
    revision: str  # what the settings asked for (branch, tag or commit)
    commit: str | None  # what it resolved to, when the hub says
    files: tuple[ManifestFile, ...] = field(default_factory=tuple)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

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
        return f"{self.repo.replace('/', '--')}@{self.pin[:16]}"

    def to_dict(self) -> dict:
        return {
            "hub": self.hub,
            "repo": self.repo,
            "revision": self.revision,
            "commit": self.commit,
            "digest": self.digest,
            "files": [asdict(f) for f in self.files],
        }

    @classmethod
    def from_dict(cls, data: dict) -> Manifest:
        return cls(
            hub=data["hub"],
            repo=data["repo"],
            revision=data["revision"],
            commit=data.get("commit"),
            files=tuple(ManifestFile(**f) for f in data["files"]),
        )

    def summary(self) -> dict:
        return {
            "hub": self.hub,
            "repo": self.repo,
            "revision": self.revision,
            "commit": self.commit,
            "files": len(self.files),
            "bytes": self.total_bytes,
            "digest": self.digest,
        }


def git_blob_sha1(data: bytes) -> str:
    """The id git (and the Hugging Face hub) gives a small file."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
