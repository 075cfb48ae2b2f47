"""Ask a model hub, once, on the controller, what a release's model is.

Both official clients are used: huggingface_hub and modelscope. Resolved
manifests are cached by commit (immutable), so a re-plan of a pinned commit
works with the hub unreachable.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import logging
import os
import shutil
from functools import lru_cache
from pathlib import Path

from sparkfleet import FILES_DIR, PROJECT_ROOT
from sparkfleet.contract.shared import host_module
from sparkfleet.model.manifest import COMMIT_RE, Manifest, ManifestFile, UntrustedAnswer


class HubError(RuntimeError):
    """The hub could not be asked; the message says which hub and why."""


def cache_dir() -> Path:
    return Path(os.environ.get("SPARKFLEET_CACHE", PROJECT_ROOT / ".cache"))


def _manifest_cache(hub: str, repo: str, pin: str) -> Path:
    """Where a manifest is cached: refused unless it resolves under the cache's manifests directory."""
    root = cache_dir() / "manifests"
    name = host_module.check_dir_name(f"{repo.replace('/', '--')}@{pin}.json")
    return host_module.inside(root, root / host_module.check_dir_name(hub) / name)


def _hf_manifest(repo: str, revision: str, endpoint: str | None, token: str | None) -> Manifest:
    from huggingface_hub import HfApi

    info = HfApi(endpoint=endpoint, token=token).model_info(repo, revision=revision, files_metadata=True)
    files = []
    for sibling in info.siblings or []:
        lfs = sibling.lfs
        sha256 = (lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)) if lfs else None
        files.append(
            ManifestFile(
                path=sibling.rfilename,
                size=int(sibling.size or 0),
                sha256=sha256,
                blob_sha1=None if sha256 else sibling.blob_id,
            )
        )
    return Manifest("huggingface", repo, revision, info.sha, tuple(files))


def _modelscope_manifest(repo: str, revision: str, endpoint: str | None, token: str | None) -> Manifest:
    from modelscope_hub import HubApi
    from modelscope_hub.utils.logger import get_logger

    get_logger().setLevel(logging.ERROR)  # its retries log warnings; the failure is reported once, as HubError
    api = HubApi(endpoint=endpoint, token=token)
    listing = api.list_repo_files(repo, "model", revision=revision, recursive=True)
    files = tuple(
        ManifestFile(path=f.path, size=f.size, sha256=f.sha256) for f in listing if not f.is_dir
    )
    commit = revision if COMMIT_RE.fullmatch(revision) else _modelscope_commit(api, repo, revision)
    return Manifest("modelscope", repo, revision, commit, files)


def _modelscope_commit(api, repo: str, revision: str) -> str | None:
    """A branch or tag's commit, when the hub's revision list carries one."""
    branches, tags = api.legacy.list_revisions_detail(repo_id=repo, repo_type="model")
    for entry in [*branches, *tags]:
        if entry.get("Revision") == revision:
            commit = entry.get("CommitId") or entry.get("Commit") or entry.get("Sha")
            if commit and COMMIT_RE.fullmatch(commit):
                return commit
    return None


_RESOLVERS = {"huggingface": _hf_manifest, "modelscope": _modelscope_manifest}


def resolve_manifest(hub: str, repo: str, revision: str, endpoint: str | None, token: str | None) -> Manifest:
    """The manifest of repo@revision, asked once per run (a failure too)."""
    result = _resolve_manifest(hub, repo, revision, endpoint, token)
    if isinstance(result, HubError):
        raise result
    return result


@lru_cache(maxsize=32)
def _resolve_manifest(hub: str, repo: str, revision: str, endpoint: str | None, token: str | None):
    if COMMIT_RE.fullmatch(revision):
        cached = _manifest_cache(hub, repo, revision)
        if cached.exists():
            return Manifest.from_dict(json.loads(cached.read_text()))
    where = endpoint or "the client's default endpoint"
    try:
        manifest = _RESOLVERS[hub](repo, revision, endpoint, token)
    except UntrustedAnswer as exc:
        return HubError(f"refusing {hub}:{repo}@{revision} from {where}: its answer {exc}; "
                        f"check that hub_endpoint/controller_hub_endpoint is a hub you trust")
    except Exception as exc:  # each client raises its own (httpx2, requests) error types
        return HubError(
            f"cannot resolve {hub}:{repo}@{revision} at {where}: {type(exc).__name__}: {exc}. "
            f"Check the network or set hub_endpoint/controller_hub_endpoint to a reachable mirror."
        )
    if not manifest.files:
        return HubError(f"{hub}:{repo}@{revision} lists no files: check model_repo and model_revision")
    path = _manifest_cache(hub, repo, manifest.pin)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest.to_dict(), indent=1))
    return manifest


@lru_cache(maxsize=1)
def _fetch_script():
    """files/sparkfleet-fetch as a module: the hosts' one way to download a hub file (capped, literal name)."""
    loader = importlib.machinery.SourceFileLoader("sparkfleet_fetch", str(FILES_DIR / "sparkfleet-fetch"))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


@lru_cache(maxsize=32)
def read_model_config(manifest: Manifest, endpoint: str | None, token: str | None) -> dict:
    """config.json of the model, through the hub's official client as the hosts download it (never past the
    manifest's size, then its hash checked); cached on disk by pin."""
    dest = cache_dir() / "configs" / manifest.hub / manifest.dir_name
    entry = manifest.entries.get("config.json")
    if entry is None:
        raise HubError(f"{manifest.hub}:{manifest.repo} lists no config.json: check model_repo")
    if not (dest / "config.json").exists():
        staging = cache_dir() / "configs" / host_module.STAGING_NAME / manifest.hub / manifest.dir_name
        try:
            _fetch_script().hub_download(manifest.to_dict(), endpoint, "config.json", entry["size"], staging, token)
            if not host_module.file_matches(staging / "config.json", entry):
                raise UntrustedAnswer("its bytes do not match the manifest's size and hash")
            dest.mkdir(parents=True, exist_ok=True)
            os.replace(staging / "config.json", dest / "config.json")
        except Exception as exc:  # each client raises its own error types
            raise HubError(f"cannot read config.json of {manifest.hub}:{manifest.repo}: "
                           f"{type(exc).__name__}: {str(exc)[:300]}") from exc
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return json.loads((dest / "config.json").read_text())


def hub_resolver(s) -> tuple[Manifest | None, dict | None, str | None]:
    """The planner's resolver (`plan_hosts(..., resolve=hub_resolver)`): the settings' model asked of its hub.

    A hub that cannot answer is reported, not raised: a plan still prints.
    """
    endpoint, token = s.controller_endpoint, s.hub_token
    try:
        manifest = resolve_manifest(s.model_hub, s.model_repo, s.model_revision, endpoint, token)
        return manifest, read_model_config(manifest, endpoint, token), None
    except HubError as exc:
        return None, None, str(exc)
