"""The release lock: what each model and engine image resolved to, so that a plan never moves because a hub or a
registry moved, and a locked release needs neither.

A model is locked by the coordinate its settings name (`hub:repo@revision`, wherever it is asked from): its commit,
its manifest (every file's size and hash) and its config.json, all that a plan reads of a hub. An engine image tag
is locked to the manifest digest its registry served (an `@sha256:` reference or an archive pins itself). A plan
adds what the lock lacks, as a package manager adds a new dependency; `sparkfleet update` is the one way an entry
moves. This module is the format and the pure rules; the file is read and written by `controller/inventory.py`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sparkfleet.contract.settings import Settings, SettingsError
from sparkfleet.model.manifest import Manifest, ManifestFile, UntrustedAnswer
from sparkfleet.release.image import DIGEST_RE, ImagePin, parse_image

VERSION: Final = 1
FIX = "restore it (e.g. from git), or delete it: the next plan resolves every model and image again"


class LockError(SettingsError):
    """A lock file that cannot be used: one line naming the file, what is wrong and the fix."""

    heading = None  # its one line names the lock file: no "invalid settings" above it

    def __init__(self, path: object, why: str):
        super().__init__([f"lock file {path}: {why}: {FIX}"])


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class LockedFile(_Strict):
    path: str
    size: int = Field(ge=0)
    sha256: str | None = None
    blob_sha1: str | None = None


Hub = Literal["huggingface", "modelscope"]


class LockedModel(_Strict):
    hub: Hub
    repo: str
    revision: str
    commit: str | None = None  # what the revision resolved to (None: the hub named none; the files' digest pins it)
    files: list[LockedFile] = Field(min_length=1)
    config: dict[str, Any] | None = None  # config.json as the hub served it (None: the resolver read none)
    selection: list[str] | None = None  # the `model_files` globs the files are (None: every file of the repo)

    @model_validator(mode="after")
    def _a_manifest(self) -> LockedModel:
        try:
            self.manifest()
        except UntrustedAnswer as exc:  # a path that climbs out, a hash that is not one, a bad commit id
            raise ValueError(str(exc)) from None
        return self

    def manifest(self) -> Manifest:
        files = tuple(ManifestFile(**f.model_dump()) for f in self.files)
        return Manifest(self.hub, self.repo, self.revision, self.commit, files,
                        tuple(self.selection) if self.selection is not None else None)

    @classmethod
    def of(cls, manifest: Manifest, config: dict | None) -> LockedModel:
        files = [LockedFile(**{k: v for k, v in asdict(f).items() if v is not None}) for f in manifest.files]
        hub = cast(Hub, manifest.hub)  # the model's strict validation refuses any other
        return cls(hub=hub, repo=manifest.repo, revision=manifest.revision, commit=manifest.commit,
                   files=files, config=config,
                   selection=list(manifest.selection) if manifest.selection is not None else None)

    def to_dict(self) -> dict:
        return {"hub": self.hub, "repo": self.repo, "revision": self.revision, "commit": self.commit,
                "files": [f.model_dump(exclude_none=True) for f in self.files], "config": self.config} | (
            {"selection": self.selection} if self.selection is not None else {})


class LockedImage(_Strict):
    digest: str = Field(pattern=f"^{DIGEST_RE.pattern}$")


class Lock(_Strict):
    version: Literal[1] = VERSION
    models: dict[str, LockedModel] = Field(default_factory=dict)
    images: dict[str, LockedImage] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _keys_name_their_entries(self) -> Lock:
        for key, entry in self.models.items():
            # a coordinate names its revision, or the commit it is (a commit's manifest may be a branch's, cached)
            named = {coordinate(entry.hub, entry.repo, entry.revision, entry.selection)} | (
                {coordinate(entry.hub, entry.repo, entry.commit, entry.selection)} if entry.commit else set())
            if key not in named:
                raise ValueError(f"models[{key!r}] holds {coordinate(entry.hub, entry.repo, entry.revision)}")
        return self

    def merged(self, other: Lock) -> Lock:
        """This lock with `other`'s entries over its own."""
        return Lock(models={**self.models, **other.models}, images={**self.images, **other.images})

    def render(self) -> str:
        """Stable bytes for review in git: sorted keys, one entry per line block, a final newline."""
        body = {"version": self.version, "models": {k: m.to_dict() for k, m in self.models.items()},
                "images": {k: {"digest": i.digest} for k, i in self.images.items()}}
        return json.dumps(body, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def parse_lock(text: str, path: object) -> Lock:
    """The lock in `text`, or LockError naming `path`, the first problem and the fix."""
    try:
        return Lock.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        raise LockError(path, f"{where + ': ' if where else ''}{message}"[:300]) from None


def coordinate(hub: str, repo: str, revision: str, selection: list[str] | None = None) -> str:
    """A model's key: what the settings name, not where it is asked from (endpoint and token are left out); a
    `model_files` selection is part of it (other globs, other files)."""
    return f"{hub}:{repo}@{revision}" + (f"?files={','.join(selection)}" if selection is not None else "")


def image_lockable(s: Settings) -> bool:
    """A tag asked of a registry; an `@sha256:` reference and an archive pin themselves with no registry."""
    return not s.engine_image_archive and not parse_image(s.engine_image).digest


class Locking:
    """A planner's resolvers (`plan_hosts(..., resolve=locking.model, resolve_image=locking.image)`) that answer
    from `lock` and ask `resolve` / `resolve_image` only for what it lacks; `added` holds what they answered."""

    def __init__(self, lock: Lock, resolve, resolve_image):
        self.lock, self._resolve, self._resolve_image = lock, resolve, resolve_image
        self.added = Lock()

    def model(self, s: Settings) -> tuple[Manifest | None, dict | None, str | None]:
        key = coordinate(s.model_hub, s.model_repo, s.model_revision, s.model_files)
        entry = self.lock.models.get(key) or self.added.models.get(key)
        if entry:
            return entry.manifest(), entry.config, None
        manifest, config, error = self._resolve(s)
        if manifest is not None:
            self.added.models[key] = LockedModel.of(manifest, config)
        return manifest, config, error

    def image(self, s: Settings) -> tuple[ImagePin | None, str | None]:
        if not image_lockable(s):
            return self._resolve_image(s)
        entry = self.lock.images.get(s.engine_image) or self.added.images.get(s.engine_image)
        if entry:
            return ImagePin(parse_image(s.engine_image).pinned(entry.digest), entry.digest, "registry"), None
        pin, error = self._resolve_image(s)
        if pin is not None and pin.source == "registry":
            self.added.images[s.engine_image] = LockedImage(digest=pin.digest)
        return pin, error


@dataclass(frozen=True)
class Change:
    """One lock entry that moves: a model (old -> new pin, the files whose hash differs) or an image's digest."""
    kind: str  # "model" or "image"
    key: str
    old: str | None  # None: not locked before
    new: str
    files: tuple[str, ...] = ()  # paths new or with other bytes
    changed_bytes: int = 0  # their sizes
    total_bytes: int = 0  # the new manifest's: what a host without the old files downloads

    def to_dict(self) -> dict:
        return asdict(self) | {"files": list(self.files)}


def _pin(entry: LockedModel) -> str:
    return entry.manifest().pin


def changes(old: Lock, new: Lock) -> list[Change]:
    """What differs from `old` to `new`, entry by entry (a model whose files are the same bytes is unchanged)."""
    found = []
    for key, entry in sorted(new.models.items()):
        was = old.models.get(key)
        manifest = entry.manifest()
        if was and was.manifest().digest == manifest.digest and was.commit == entry.commit:
            continue
        before = {f.path: (f.size, f.sha256, f.blob_sha1) for f in was.files} if was else {}
        moved = [f for f in entry.files if before.get(f.path) != (f.size, f.sha256, f.blob_sha1)]
        found.append(Change("model", key, _pin(was) if was else None, manifest.pin, tuple(f.path for f in moved),
                            sum(f.size for f in moved), manifest.total_bytes))
    for key, image in sorted(new.images.items()):
        had = old.images.get(key)
        if not had or had.digest != image.digest:
            found.append(Change("image", key, had.digest if had else None, image.digest))
    return found
