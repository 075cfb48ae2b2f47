"""The engine image pinned by content: a tag is resolved to a digest once per run, on the controller.

A registry may serve other bytes under the same tag tomorrow; a digest cannot
move. The plan pins the manifest digest the registry serves for the tag (the
Distribution API, anonymous bearer tokens included), or, with
engine_image_archive, the image id (config digest) of the `docker save` tar the
hosts load. A reference that already carries `@sha256:` is used as given.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import threading
from dataclasses import dataclass
from pathlib import Path

import requests

# Docker's default for a reference with no registry part: the reference's domain and its API host.
DOCKER_HUB = ("docker.io", "registry-1.docker.io")
MANIFEST_TYPES = ", ".join((
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
))
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
TIMEOUT_S = 15
FIX = "reach the registry, set engine_image_archive, or pin engine_image with @sha256:<digest>"


class ImageError(Exception):
    """One line: which image, what went wrong, the fix."""


@dataclass(frozen=True)
class ImageName:
    domain: str | None  # None: Docker's default registry
    path: str  # the repository path as written, e.g. "vllm/vllm-openai"
    tag: str | None
    digest: str | None

    @property
    def name(self) -> str:
        """The reference without tag or digest, in Docker's familiar form (what RepoDigests list): the default
        registry's domain and its library/ dropped."""
        if self.domain in (None, DOCKER_HUB[0]):
            return self.path.removeprefix("library/")
        return f"{self.domain}/{self.path}"

    @property
    def repository(self) -> str:
        """The repository the registry API names (Docker's default registry puts one-part names in library/)."""
        if self.domain in (None, DOCKER_HUB[0]) and "/" not in self.path:
            return f"library/{self.path}"
        return self.path

    def pinned(self, digest: str) -> str:
        return f"{self.name}@{digest}"


def parse_image(ref: str) -> ImageName:
    """Split a reference (already checked against Docker's grammar by the settings) into its parts."""
    rest, _, digest = ref.partition("@")
    first, slash, remainder = rest.partition("/")
    domain = first if slash and ("." in first or ":" in first or first == "localhost") else None
    path = remainder if domain else rest
    path, colon, tag = path.partition(":")
    return ImageName(domain, path, tag if colon else None, digest or None)


def registry_base(image: ImageName, controller_url: str | None) -> str:
    """Where the controller asks: controller_registry_url when set, else the image's registry over HTTPS."""
    if controller_url:
        return controller_url.rstrip("/")
    host = DOCKER_HUB[1] if image.domain in (None, DOCKER_HUB[0]) else image.domain
    return f"https://{host}"


def _bearer_token(challenge: str, repository: str, session: requests.Session) -> str:
    """The anonymous token a `WWW-Authenticate: Bearer realm=...,service=...,scope=...` challenge offers."""
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = params.pop("realm", None)
    if not challenge.lower().startswith("bearer") or not realm:
        raise ImageError(f"asks for credentials ({challenge.split(' ', 1)[0] or 'no challenge'}); "
                         f"only anonymous bearer tokens are supported")
    params.setdefault("scope", f"repository:{repository}:pull")
    answer = session.get(realm, params=params, timeout=TIMEOUT_S)
    if answer.status_code != 200:
        raise ImageError(f"token service {realm} answered HTTP {answer.status_code}")
    try:
        body = answer.json()
        return body.get("token") or body["access_token"]
    except (ValueError, KeyError, AttributeError):
        raise ImageError(f"token service {realm} answered no token") from None


def registry_digest(ref: str, controller_url: str | None = None, session: requests.Session | None = None) -> str:
    """The manifest digest the registry serves for the reference's tag (HEAD, then GET when no header)."""
    image = parse_image(ref)
    base = registry_base(image, controller_url)
    url = f"{base}/v2/{image.repository}/manifests/{image.tag or 'latest'}"
    session = session or requests.Session()
    headers = {"Accept": MANIFEST_TYPES}
    try:
        try:
            answer = session.head(url, headers=headers, timeout=TIMEOUT_S, allow_redirects=True)
            if answer.status_code == 401:
                token = _bearer_token(answer.headers.get("WWW-Authenticate", ""), image.repository, session)
                headers["Authorization"] = f"Bearer {token}"
                answer = session.head(url, headers=headers, timeout=TIMEOUT_S, allow_redirects=True)
            digest = answer.headers.get("Docker-Content-Digest")
            if answer.status_code == 200 and not digest:
                body = session.get(url, headers=headers, timeout=TIMEOUT_S)
                digest = "sha256:" + hashlib.sha256(body.content).hexdigest() if body.status_code == 200 else None
        except requests.RequestException as exc:
            raise ImageError(f"unreachable ({type(exc).__name__})") from None
        if answer.status_code == 404:
            raise ImageError(f"has no tag {image.tag or 'latest'} in {image.repository} (HTTP 404)")
        if answer.status_code != 200:
            raise ImageError(f"answered HTTP {answer.status_code}")
        if not digest or not DIGEST_RE.fullmatch(digest):
            raise ImageError(f"answered no sha256 digest (Docker-Content-Digest: {str(digest)[:80]!r})")
    except ImageError as exc:
        raise ImageError(f"engine image {ref}: registry {base} {exc}: {FIX}") from None
    return digest


def _member(tar: tarfile.TarFile, name: str) -> io.BufferedReader:
    """A regular file's bytes in the tar (KeyError: missing, or a directory or link)."""
    member = tar.extractfile(name)
    if not isinstance(member, io.BufferedReader):  # tarfile's file object is one; None for a directory or link
        raise KeyError(name)
    return member


def archive_image_id(archive: str, ref: str) -> str:
    """The image id (sha256 of its config) of `ref` in a `docker save` tar, hashed here, not read from names."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            entries = json.load(_member(tar, "manifest.json"))
            chosen = [e for e in entries if ref in (e.get("RepoTags") or [])] or (entries if len(entries) == 1 else [])
            if not chosen:
                raise ImageError(f"holds no image tagged {ref} (and more than one image)")
            config = _member(tar, chosen[0]["Config"])
            return "sha256:" + hashlib.file_digest(config, "sha256").hexdigest()
    except ImageError as exc:
        raise ImageError(f"engine image archive {archive} {exc}: `docker save {ref} -o {archive}`") from None
    except (OSError, tarfile.TarError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ImageError(f"engine image archive {archive} is not a readable `docker save` tar "
                         f"({type(exc).__name__}): `docker save {ref} -o {archive}`") from None


@dataclass(frozen=True)
class ImagePin:
    """What the unit runs and how the host checks it: `ref` is `name@<manifest digest>` (RepoDigests hold it)
    or, from an archive, the image id (`docker image inspect`'s Id equals it)."""
    ref: str
    digest: str
    source: str  # "registry", "archive" or "given"


_cache: dict[tuple, ImagePin] = {}
_lock = threading.Lock()  # pyinfra plans hosts concurrently: ask each registry once per image per run


def pin_image(s) -> ImagePin:
    """The settings' engine image pinned by content, or ImageError (one line naming the fix)."""
    image = parse_image(s.engine_image)
    key: tuple
    if s.engine_image_archive:
        stat = Path(s.engine_image_archive).stat() if Path(s.engine_image_archive).exists() else None
        key = ("archive", s.engine_image_archive, s.engine_image, stat and (stat.st_size, stat.st_mtime_ns))
    elif image.digest:
        return ImagePin(image.pinned(image.digest), image.digest, "given")
    else:
        key = ("registry", s.engine_image, s.controller_registry_url)
    with _lock:
        if key not in _cache:
            if s.engine_image_archive:
                digest = archive_image_id(s.engine_image_archive, s.engine_image)
                if image.digest:
                    raise ImageError(f"engine image {s.engine_image} names a manifest digest, and "
                                     f"engine_image_archive holds image id {digest}: drop the @sha256: part")
                _cache[key] = ImagePin(digest, digest, "archive")
            else:
                digest = registry_digest(s.engine_image, s.controller_registry_url)
                _cache[key] = ImagePin(image.pinned(digest), digest, "registry")
        return _cache[key]


def image_resolver(s) -> tuple[ImagePin | None, str | None]:
    """The planner's image resolver (`plan_hosts(..., resolve_image=image_resolver)`): reported, not raised."""
    try:
        return pin_image(s), None
    except ImageError as exc:
        return None, str(exc)


def offline_image(s) -> tuple[ImagePin | None, str | None]:
    """An offline plan asks no registry: a reference pinned with @sha256: stands, anything else is unknown."""
    image = parse_image(s.engine_image)
    if image.digest and not s.engine_image_archive:
        return ImagePin(image.pinned(image.digest), image.digest, "given"), None
    return None, f"engine image {s.engine_image}: digest unknown (offline plan): {FIX}"
