"""Ask a model hub, once, on the controller, what a release's model is.

Both official clients are used: huggingface_hub and modelscope. Resolved
manifests are cached by commit (immutable), so a re-plan of a pinned commit
works with the hub unreachable. A model is config.json and its weights, or a
GGUF model (gguf.entry_file), whose facts come from its first file's header,
read with Range requests (never the whole file). `model_files` narrows the
manifest here, in hub_resolver, the one place every later stage reads.
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

import sparkfleet
from sparkfleet import FILES_DIR
from sparkfleet.contract.shared import verify
from sparkfleet.contract.settings import SettingsError
from sparkfleet.model import gguf
from sparkfleet.model.manifest import COMMIT_RE, Manifest, ManifestFile, UntrustedAnswer, selected


class HubError(RuntimeError):
    """The hub could not be asked; the message says which hub and why."""


def cache_dir() -> Path:
    """$SPARKFLEET_CACHE, else .cache/ in the project (the inventory's while a command runs: controller/inventory.py
    `project_for`), read when asked, never at import."""
    return Path(os.environ.get("SPARKFLEET_CACHE") or Path(sparkfleet.PROJECT_ROOT) / ".cache")


def _manifest_cache(hub: str, repo: str, pin: str) -> Path:
    """Where a manifest is cached: refused unless it resolves under the cache's manifests directory."""
    root = cache_dir() / "manifests"
    name = verify.check_dir_name(f"{repo.replace('/', '--')}@{pin}.json")
    return verify.inside(root, root / verify.check_dir_name(hub) / name)


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
        staging = cache_dir() / "configs" / verify.STAGING_NAME / manifest.hub / manifest.dir_name
        try:
            _fetch_script().hub_download(manifest.to_dict(), endpoint, "config.json", entry["size"], staging, token)
            if not verify.file_matches(staging / "config.json", entry):
                raise UntrustedAnswer("its bytes do not match the manifest's size and hash")
            dest.mkdir(parents=True, exist_ok=True)
            os.replace(staging / "config.json", dest / "config.json")
        except Exception as exc:  # each client raises its own error types
            raise HubError(f"cannot read config.json of {manifest.hub}:{manifest.repo}: "
                           f"{type(exc).__name__}: {str(exc)[:300]}") from exc
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return json.loads((dest / "config.json").read_text())


# The first read of a GGUF header (most models' key-value sections, their vocabulary included, are a few MiB);
# a longer one is read on, four times as far each time, up to gguf.MAX_HEADER_BYTES.
GGUF_FIRST_READ = 2**20
RANGE_TIMEOUT_S = 60


def _capped_body(status: int, chunks, start: int, stop: int) -> bytes:
    """The reply to a Range request for [start, stop): at most stop - start bytes (a hub that ignores Range and
    sends the whole file from byte 0 is read only that far)."""
    if not (status == 206 or (status == 200 and start == 0)):
        raise HubError(f"HTTP {status} to a Range request")
    want, body = stop - start, bytearray()
    for chunk in chunks:
        body += chunk[:want - len(body)]
        if len(body) >= want:
            break
    return bytes(body)


def _hf_ranges(manifest: Manifest, endpoint: str | None, token: str | None):
    """Range reads of a Hugging Face file: the client's resolve URL, headers and HTTP session."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session

    session, headers = get_session(), build_hf_headers(token=token)

    def read(path: str, start: int, stop: int) -> bytes:
        url = hf_hub_url(manifest.repo, path, revision=manifest.commit or manifest.revision, endpoint=endpoint)
        with session.stream("GET", url, headers={**headers, "Range": f"bytes={start}-{stop - 1}"},
                            follow_redirects=True, timeout=RANGE_TIMEOUT_S) as reply:
            return _capped_body(reply.status_code, reply.iter_bytes(), start, stop)
    return read


def _modelscope_ranges(manifest: Manifest, endpoint: str | None, token: str | None):
    """Range reads of a ModelScope file: the client's download URL (its endpoint, its URL rules), the key as
    a bearer header (dropped by requests on a redirect to another host)."""
    import requests
    from modelscope_hub import HubApi

    api = HubApi(endpoint=endpoint, token=token)
    if endpoint is None:  # as the client's own download picks its read endpoint (and the hosts' fetch does)
        try:
            api = HubApi(endpoint=api.resolve_endpoint_for_read(manifest.repo, repo_type="model"), token=token)
        except Exception:
            pass
    auth = {"Authorization": f"Bearer {token}"} if token else {}

    def read(path: str, start: int, stop: int) -> bytes:
        url = api.legacy.get_download_url(manifest.repo, "model", path, manifest.commit or manifest.revision)
        with requests.get(url, headers={**auth, "Range": f"bytes={start}-{stop - 1}"}, stream=True,
                          timeout=RANGE_TIMEOUT_S) as reply:
            return _capped_body(reply.status_code, reply.iter_content(1 << 16), start, stop)
    return read


_RANGES = {"huggingface": _hf_ranges, "modelscope": _modelscope_ranges}


class ShortAnswer(gguf.GGUFError):
    """The hub sent fewer bytes than asked: its answer, not the file's header (not remembered as a refusal)."""


def read_gguf_header(read, path: str, size: int) -> gguf.Header:
    """The header of `path` (`size` bytes, the manifest's), parsed once from its start while `read(path, start,
    stop)` fetches the next range each time the parse needs more (GGUF_FIRST_READ, then at least four times
    what is here); never past `size` or gguf.MAX_HEADER_BYTES. GGUFError when the bytes are not a header within
    those bounds and gguf's budget."""
    def more(have: int, needed: int) -> bytes:
        if needed > size:
            raise gguf.GGUFError(f"the file ({size:,} bytes) ends inside its header")
        want = min(size, max(needed, 4 * have, GGUF_FIRST_READ), gguf.MAX_HEADER_BYTES)
        got = read(path, have, want)
        if len(got) < want - have:
            raise ShortAnswer(f"the hub sent {have + len(got):,} of bytes 0-{want - 1}")
        return got[:want - have]
    return gguf.read_header(b"", more)


@lru_cache(maxsize=32)
def read_gguf_config(manifest: Manifest, entry: str, endpoint: str | None, token: str | None) -> dict:
    """The planner's config of a GGUF model, from its first file's header (gguf.planner_config), read through
    the hub's client with Range requests and never the whole file; cached on disk by pin. The header is data:
    the file's hash is checked when a host fetches it."""
    name = verify.check_dir_name(f"{entry.replace('/', '--')}.config.json")
    dest = verify.inside(cache_dir() / "configs", cache_dir() / "configs" / manifest.hub / manifest.dir_name
                              / name)
    refused = dest.with_name(verify.check_dir_name(f"{entry.replace('/', '--')}.refused"))
    if refused.exists():  # the pin's bytes do not change: neither does their refusal, nor its cost, paid once
        raise HubError(refused.read_text().strip())
    if not dest.exists():
        try:
            header = read_gguf_header(_RANGES[manifest.hub](manifest, endpoint, token), entry,
                                      manifest.entries[entry]["size"])
            config = gguf.planner_config(header.metadata)
        except gguf.GGUFError as exc:
            refusal = (f"refusing the GGUF header of {manifest.hub}:{manifest.repo} {entry}: {exc}; check "
                       f"model_repo and model_files, or the hub it came from (hub_endpoint)")
            if not isinstance(exc, ShortAnswer):
                refused.parent.mkdir(parents=True, exist_ok=True)
                refused.write_text(refusal + "\n")
            raise HubError(refusal) from None
        except Exception as exc:  # each client raises its own error types
            raise HubError(f"cannot read the GGUF header of {manifest.hub}:{manifest.repo} {entry}: "
                           f"{type(exc).__name__}: {str(exc)[:300]}") from exc
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(json.dumps(config, indent=1))
    return json.loads(dest.read_text())


def model_config(manifest: Manifest, endpoint: str | None, token: str | None) -> dict:
    """What the planner reads of a model: a GGUF model's header (no config.json needed), else config.json.
    ValueError when the files hold more than one GGUF model (set model_files)."""
    entry = gguf.entry_file([f.path for f in manifest.files])
    if entry:
        return read_gguf_config(manifest, entry, endpoint, token)
    return read_model_config(manifest, endpoint, token)


def hub_resolver(s) -> tuple[Manifest | None, dict | None, str | None]:
    """The planner's resolver (`plan_hosts(..., resolve=hub_resolver)`): the settings' model asked of its hub,
    narrowed to `model_files` (the one place a selection is applied).

    A hub that cannot answer is reported, not raised: a plan still prints. Files that cannot be served (a glob
    matching nothing, more than one GGUF model) are refused: SettingsError.
    """
    endpoint, token = s.controller_endpoint, s.hub_token
    try:
        manifest = selected(resolve_manifest(s.model_hub, s.model_repo, s.model_revision, endpoint, token),
                            s.model_files)
        return manifest, model_config(manifest, endpoint, token), None
    except HubError as exc:  # it may quote the hub's answer: cut, and its control characters shown, here
        from sparkfleet.tables import clean

        return None, None, clean(exc)
    except ValueError as exc:
        raise SettingsError([f"{s.model_repo}: {exc}"]) from None
