"""The simulated fleet's local model hub.

A threaded HTTP server (standard library only) that serves model repositories
found under a data directory and speaks the subset of the Hugging Face Hub and
ModelScope APIs that the official clients (huggingface_hub 2.x, modelscope /
modelscope_hub) call to list and download a repository:

Hugging Face
  GET  /api/models/{repo}[/revision/{rev}][?blobs=true]   model info (sha, siblings)
  GET  /api/models/{repo}/tree/{rev}[/{dir}]?recursive=   file tree (oid, size, lfs)
  GET  /api/models/{repo}/refs                            branches
  HEAD /{repo}/resolve/{rev}/{path}                       metadata headers
  GET  /{repo}/resolve/{rev}/{path}                       file bytes (Range honoured)
ModelScope
  GET  /api/v1/models/{repo}                              model info
  GET  /api/v1/models/{repo}/revisions                    branches
  GET  /api/v1/models/{repo}/repo/files?Revision=&Recursive=&Root=
  GET  /api/v1/models/{repo}/repo?Revision=&FilePath=     file bytes (Range honoured)
Admin (JSON)
  GET  /_sim/counters   GET /_sim/knobs   GET /_sim/repos   GET /_sim/requests
  POST /_sim/reset      POST /_sim/knobs
  POST /_sim/publish {"repo": ID}     a new commit on the branch, README.md changed; older commits still served
  POST /_sim/unpublish {"repo": ID}   the branch back on the generated commit, the published ones dropped

Files that are *.safetensors or >= 1 MiB are "LFS": Hugging Face gets their
sha256 as ETag and in `lfs`; other files get their git blob SHA-1. ModelScope
listings carry Sha256 for every file. No Xet headers (X-Xet-*, Link rel=xet-auth)
and no `xetHash` fields are ever sent, so huggingface_hub downloads over plain
HTTP even with hf_xet installed.

Run: python3 -m sim.hub.server --data DIR [--generate Qwen/Qwen3.5-35B-A3B-FP8]
     python3 path/to/server.py --data DIR ...
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import shutil
import socket
import struct
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote

LFS_THRESHOLD = 1024 * 1024
HF_BRANCH = "main"
MS_BRANCH = "master"
_LFS_SPEC = "https://git-lfs.github.com/spec/v1"
_FIXED_DATE = "2026-01-01T00:00:00.000Z"
_FIXED_EPOCH = 1767225600
_CHUNK = 64 * 1024
_SKIP_DIRS = {".git", ".cache"}
_SKIP_SUFFIXES = (".incomplete", ".lock", ".tmp")


# ---------------------------------------------------------------- repositories


@dataclass(frozen=True)
class RepoFile:
    path: str  # '/'-separated, relative to the repo root
    abspath: Path
    size: int
    sha256: str
    blob_sha1: str  # git blob id of the content
    lfs: bool

    @property
    def pointer(self) -> bytes:
        return f"version {_LFS_SPEC}\noid sha256:{self.sha256}\nsize {self.size}\n".encode()

    @property
    def oid(self) -> str:
        """The git object id a hub reports: the LFS pointer's blob for LFS files."""
        return _git_blob_sha1(self.pointer) if self.lfs else self.blob_sha1


def _git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _hash_file(path: Path) -> tuple[int, str, str]:
    size = path.stat().st_size
    sha256 = hashlib.sha256()
    sha1 = hashlib.sha1(b"blob %d\0" % size)
    with path.open("rb") as f:
        while chunk := f.read(1024 * 1024):
            sha256.update(chunk)
            sha1.update(chunk)
    return size, sha256.hexdigest(), sha1.hexdigest()


def _safetensors_params(path: Path) -> dict[str, int]:
    try:
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100 * 1024 * 1024:
                return {}
            header = json.loads(f.read(n))
    except (OSError, ValueError, struct.error):
        return {}
    out: dict[str, int] = {}
    for name, info in header.items():
        if name == "__metadata__" or not isinstance(info, dict):
            continue
        count = 1
        for d in info.get("shape", []):
            count *= int(d)
        out[info.get("dtype", "?")] = out.get(info.get("dtype", "?"), 0) + count
    return out


def _commit_id(repo_id: str, files: dict[str, RepoFile]) -> str:
    """A fake but stable commit id: a digest of the repo id and every (path, sha256), so two hubs agree."""
    digest = hashlib.sha1(repo_id.encode())
    for f in files.values():
        digest.update(f"\n{f.path}\0{f.sha256}".encode())
    return digest.hexdigest()


def _repo_file(rel: str, abspath: Path) -> RepoFile:
    size, sha256, sha1 = _hash_file(abspath)
    lfs = rel.endswith((".safetensors", ".gguf")) or size >= LFS_THRESHOLD  # weights are LFS files on a hub
    return RepoFile(rel, abspath, size, sha256, sha1, lfs)


# What the model info says a repository is: a GGUF one (llama.cpp) or the chat model's checkpoint.
_GGUF_CARD = {"library_name": "gguf", "pipeline_tag": "text-generation", "tags": ["gguf", "llama"]}
_SAFETENSORS_CARD = {"library_name": "transformers", "pipeline_tag": "image-text-to-text",
                     "tags": ["transformers", "safetensors", "qwen3_5_moe", "fp8"]}

PUBLISHED_FILE = "README.md"  # what a published commit changes: no weight, nothing a release's memory plan reads
PUBLISHED_DIR = ".published"  # DATA/.published/<org>--<name>/<n>/README.md: the bytes of published commit n


@dataclass
class Repo:
    """A repository's commits: `commit` (the branch, main and master alike) and every older one by its id."""
    repo_id: str
    root: Path
    files: dict[str, RepoFile]  # the branch's
    commit: str
    params: dict[str, int] = field(default_factory=dict)
    history: dict[str, dict[str, RepoFile]] = field(default_factory=dict)  # commit id -> its files
    published: int = 0  # commits made by publish() on top of the generated one

    @classmethod
    def load(cls, repo_id: str, root: Path) -> "Repo":
        """The repository under root, with the commits published on it before (replayed: same bytes, same ids)."""
        files: dict[str, RepoFile] = {}
        params: dict[str, int] = {}
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
            for name in sorted(filenames):
                if name.endswith(_SKIP_SUFFIXES):
                    continue
                abspath = Path(dirpath) / name
                rel = abspath.relative_to(root).as_posix()
                files[rel] = _repo_file(rel, abspath)
                if rel.endswith(".safetensors"):
                    for dtype, n in _safetensors_params(abspath).items():
                        params[dtype] = params.get(dtype, 0) + n
        files = dict(sorted(files.items()))
        commit = _commit_id(repo_id, files)
        repo = cls(repo_id, root, files, commit, params, {commit: files})
        while repo._published_dir(repo.published + 1).is_dir():
            repo.publish()
        return repo

    def _published_dir(self, n: int) -> Path:
        return self.root.parents[1] / PUBLISHED_DIR / self.repo_id.replace("/", "--") / str(n)

    def publish(self) -> str:
        """A new commit on the branch with PUBLISHED_FILE changed (its bytes a function of how many came before,
        so every hub publishing as often agrees on the id); older commits stay served by their id."""
        n = self.published + 1
        generated = self.history[next(iter(self.history))].get(PUBLISHED_FILE)
        text = (generated.abspath.read_text() if generated else "") + f"\n<!-- sim hub publish {n} -->\n"
        path = self._published_dir(n) / PUBLISHED_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        if not (path.is_file() and path.read_text() == text):
            path.write_text(text)
        files = dict(sorted({**self.files, PUBLISHED_FILE: _repo_file(PUBLISHED_FILE, path)}.items()))
        commit = _commit_id(self.repo_id, files)
        self.history[commit] = files
        self.files, self.commit, self.published = files, commit, n  # the branch moves last
        return commit

    def reset(self) -> str:
        """The branch back on the generated commit; the published ones forgotten (and their bytes removed)."""
        first = next(iter(self.history))
        self.files, self.commit, self.published = self.history[first], first, 0
        self.history = {first: self.files}
        shutil.rmtree(self._published_dir(1).parent, ignore_errors=True)
        return first

    def resolve(self, revision: str) -> str | None:
        """The commit a revision names: the branch's for main/master, else a commit id the repo has had."""
        if revision in (HF_BRANCH, MS_BRANCH):
            return self.commit
        return revision if revision in self.history else None

    def files_at(self, commit: str) -> dict[str, RepoFile]:
        return self.history.get(commit, self.files)

    def dirs(self, commit: str | None = None) -> list[str]:
        out: set[str] = set()
        for p in self.files_at(commit or self.commit):
            parts = p.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                out.add("/".join(parts[:i]))
        return sorted(out)

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files.values())


def discover_repos(data_dir: Path) -> dict[str, Repo]:
    """Every DIR/<org>/<name>/ that holds files is a repository '<org>/<name>'."""
    repos: dict[str, Repo] = {}
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        return repos
    for org in sorted(p for p in data_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for name in sorted(p for p in org.iterdir() if p.is_dir() and not p.name.startswith(".")):
            repo = Repo.load(f"{org.name}/{name.name}", name)
            if repo.files:
                repos[repo.repo_id] = repo
    return repos


# ---------------------------------------------------------------- state


class HubState:
    """Repositories, knobs and counters, shared by all handler threads."""

    def __init__(self, repos: dict[str, Repo], *, log: bool = True) -> None:
        self.repos = repos
        self.log = log
        self.lock = threading.Lock()
        self._reset_locked()

    def _reset_locked(self) -> None:
        self.total_bytes = 0
        self.file_bytes: dict[str, int] = {}
        self.client_bytes: dict[str, int] = {}
        self.requests = 0
        self.request_log: collections.deque = collections.deque(maxlen=10000)
        self.knobs: dict = {"corrupt": [], "cut_after": None, "cut_once": {}, "throttle_bps": None, "down": False}

    def reset(self) -> None:
        with self.lock:
            self._reset_locked()

    def set_knobs(self, body: dict) -> dict:
        """Merge knobs: each key given replaces that knob; all or nothing. Unknown keys are an error."""
        unknown = set(body) - set(self.knobs)
        if unknown:
            raise ValueError(f"unknown knobs: {sorted(unknown)}")
        update: dict = {}
        for key, value in body.items():
            if key == "corrupt":
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise ValueError("corrupt: a list of '<repo>/<path>'")
                update[key] = list(value)
            elif key == "cut_once":
                if not isinstance(value, dict):
                    raise ValueError("cut_once: {'<repo>/<path>': bytes}")
                update[key] = {str(k): int(v) for k, v in value.items()}
            elif key in ("cut_after", "throttle_bps"):
                update[key] = None if value is None else int(value)
                if update[key] is not None and update[key] < (1 if key == "throttle_bps" else 0):
                    raise ValueError(f"{key}: out of range")
            elif key == "down":
                update[key] = bool(value)
        with self.lock:
            self.knobs.update(update)
            return json.loads(json.dumps(self.knobs))

    def counters(self) -> dict:
        with self.lock:
            return {
                "total_bytes": self.total_bytes,
                "files": dict(self.file_bytes),
                "clients": dict(self.client_bytes),
                "requests": self.requests,
            }

    def add_bytes(self, key: str, client: str, n: int) -> None:
        with self.lock:
            self.total_bytes += n
            self.file_bytes[key] = self.file_bytes.get(key, 0) + n
            self.client_bytes[client] = self.client_bytes.get(client, 0) + n

    def download_plan(self, key: str) -> tuple[int | None, bool, int | None]:
        """(cut after N bytes or None, corrupt?, throttle) for a download starting now."""
        with self.lock:
            cut = self.knobs["cut_once"].pop(key, None)
            if cut is None:
                cut = self.knobs["cut_after"]
            return cut, key in self.knobs["corrupt"], self.knobs["throttle_bps"]


# ---------------------------------------------------------------- HTTP


class _Cut(Exception):
    """The connection was cut on purpose (cut_after / cut_once)."""


def _parse_range(header: str | None, size: int) -> tuple[int, int] | None | str:
    """Return (start, end_inclusive), None for 'whole file', or 'bad' for an unsatisfiable range."""
    if not header or size == 0:
        return None
    header = header.strip()
    if not header.startswith("bytes=") or "," in header:
        return None  # multiple or unknown units: ignore and send the whole file
    spec = header[len("bytes="):].strip()
    start_s, _, end_s = spec.partition("-")
    try:
        if start_s == "":  # suffix: last N bytes
            n = int(end_s)
            if n <= 0:
                return "bad"
            return max(0, size - n), size - 1
        start = int(start_s)
        end = int(end_s) if end_s else size - 1
    except ValueError:
        return None
    if start >= size or end < start:
        return "bad"
    return start, min(end, size - 1)


class HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sparkfleet-sim-hub/1"
    state: HubState  # set on the subclass made by make_server

    # -- plumbing

    def log_request(self, code="-", size="-") -> None:  # one line per request is written by _finish
        pass

    def log_message(self, format: str, *args) -> None:
        if self.state.log:
            sys.stderr.write("%s - %s\n" % (self.address_string(), format % args))

    def _begin(self, status: int) -> dict:
        """Record the request before any body byte goes out, so that whoever has received the body
        (a test, an e2e check) always finds the request in /_sim/requests."""
        entry = {
            "client": self.client_address[0],
            "method": self.command,
            "path": self.path,
            "status": status,
            "range": self.headers.get("Range") if self.headers else None,
            "sent": 0,
            "note": "",
        }
        with self.state.lock:
            self.state.request_log.append(entry)
        return entry

    def _finish(self, entry: dict, sent: int, note: str = "") -> None:
        """Complete the record and write the request's one log line."""
        with self.state.lock:
            entry["sent"] = sent
            entry["note"] = note
        if self.state.log:
            rng = entry["range"]
            extra = (f" range={rng}" if rng else "") + (f" {note}" if note else "")
            sys.stderr.write(f'{entry["client"]} "{self.command} {self.path}" {entry["status"]} {sent}{extra}\n')
            sys.stderr.flush()

    def _send(self, status: int, body: bytes, content_type: str, headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        entry = self._begin(status)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self._finish(entry, 0 if self.command == "HEAD" else len(body))

    def _json(self, obj, status: int = 200, headers: dict | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json; charset=utf-8", headers)

    def _hf_error(self, status: int, code: str | None, message: str, commit: str | None = None) -> None:
        headers = {"X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        if commit:
            headers["X-Repo-Commit"] = commit
        self._json({"error": message}, status, headers)

    def _ms_ok(self, data) -> None:
        self._json({"Code": 200, "Data": data, "Message": "success", "RequestId": str(uuid.uuid4()), "Success": True})

    def _ms_error(self, status: int, message: str) -> None:
        self._json({"Code": status, "Data": None, "Message": message, "RequestId": str(uuid.uuid4()),
                    "Success": False}, status)

    def _read_body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def _split(self) -> tuple[list[str], dict[str, str]]:
        raw_path, _, query = self.path.partition("?")
        segments = [unquote(s) for s in raw_path.split("/")[1:]]
        params = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
        return segments, params

    def _match_repo(self, segments: list[str]) -> tuple[Repo | None, list[str]]:
        best: tuple[Repo | None, list[str]] = (None, segments)
        best_len = 0
        for repo_id, repo in self.state.repos.items():
            id_parts = repo_id.split("/")
            if segments[: len(id_parts)] == id_parts and len(id_parts) > best_len:
                best, best_len = (repo, segments[len(id_parts):]), len(id_parts)
        return best

    # -- verbs

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        self._responded = False
        try:
            segments, params = self._split()
            if segments and segments[0] == "_sim":
                return self._admin(segments[1:])
            with self.state.lock:
                self.state.requests += 1
                down = self.state.knobs["down"]
            if down:
                self._read_body()
                return self._json({"error": "simulated outage"}, 503, {"Retry-After": "1"})
            if self.command == "POST":
                self._read_body()
                return self._hf_error(405, None, "method not allowed")
            if segments[:2] == ["api", "models"]:
                return self._hf_api(segments[2:], params)
            if segments[:3] == ["api", "v1", "models"]:
                return self._ms_api(segments[3:], params)
            if segments[:2] == ["api", "v1"]:
                return self._ms_error(404, "not found")
            repo, rest = self._match_repo(segments)
            if repo is not None and len(rest) >= 3 and rest[0] == "resolve":
                return self._hf_resolve(repo, rest[1], "/".join(rest[2:]))
            if "resolve" in segments:
                return self._hf_error(404, "RepoNotFound", "Repository not found")
            return self._hf_error(404, None, "not found")
        except (ConnectionError, _Cut):  # client went away, or we cut it on purpose
            self.close_connection = True
        except Exception as exc:  # keep serving; report the bug to the client (if still possible) and the log
            self.close_connection = True
            self.log_message("internal error on %s: %r", self.path, exc)
            if not self._responded:
                try:
                    self._json({"error": f"internal error: {exc!r}"}, 500)
                except OSError:
                    pass

    def send_response(self, code: int, message: str | None = None) -> None:
        self._responded = True
        super().send_response(code, message)

    # -- admin

    def _admin(self, rest: list[str]) -> None:
        what = rest[0] if rest else ""
        if self.command == "POST":
            raw = self._read_body()
            if what == "reset":
                self.state.reset()
                return self._json({"ok": True})
            if what == "knobs":
                try:
                    body = json.loads(raw or b"{}")
                    if not isinstance(body, dict):
                        raise ValueError("expected a JSON object")
                    return self._json(self.state.set_knobs(body))
                except (ValueError, TypeError) as exc:
                    return self._json({"error": str(exc)}, 400)
            if what in ("publish", "unpublish"):
                return self._publish(raw, what)
            return self._json({"error": "not found"}, 404)
        if what == "counters":
            return self._json(self.state.counters())
        if what == "knobs":
            with self.state.lock:
                knobs = json.loads(json.dumps(self.state.knobs))
            return self._json(knobs)
        if what == "requests":
            with self.state.lock:
                log = list(self.state.request_log)
            return self._json(log)
        if what == "repos":
            return self._json({
                rid: {"commit": r.commit, "branches": [HF_BRANCH, MS_BRANCH], "size": r.total_size,
                      "commits": list(r.history),
                      "files": {p: {"size": f.size, "sha256": f.sha256, "lfs": f.lfs} for p, f in r.files.items()}}
                for rid, r in self.state.repos.items()
            })
        return self._json({"error": "not found"}, 404)

    def _publish(self, raw: bytes, what: str) -> None:
        """POST /_sim/publish {"repo": ID}: a new commit on the branch (one file changed); /_sim/unpublish: the
        branch back on the generated commit. Answers {"repo", "commit" (the branch's now), "previous"}."""
        try:
            body = json.loads(raw or b"{}")
            repo = self.state.repos[body["repo"]]
        except (ValueError, TypeError, KeyError):
            return self._json({"error": f"expected {{\"repo\": ID}} naming one of {sorted(self.state.repos)}"}, 400)
        with self.state.lock:
            previous = repo.commit
            commit = repo.publish() if what == "publish" else repo.reset()
        return self._json({"repo": repo.repo_id, "commit": commit, "previous": previous})

    # -- Hugging Face

    def _hf_api(self, segments: list[str], params: dict[str, str]) -> None:
        repo, rest = self._match_repo(segments)
        if repo is None:
            return self._hf_error(404, "RepoNotFound", "Repository not found")
        if not rest:
            return self._hf_model_info(repo, HF_BRANCH, params)
        if rest[0] == "revision" and len(rest) >= 2:
            return self._hf_model_info(repo, "/".join(rest[1:]), params)
        if rest[0] == "tree" and len(rest) >= 2:
            return self._hf_tree(repo, rest[1], "/".join(rest[2:]).strip("/"), params)
        if rest[0] == "refs":
            branch = {"ref": f"refs/heads/{HF_BRANCH}", "name": HF_BRANCH, "targetCommit": repo.commit}
            return self._json({"branches": [branch], "converts": [], "tags": []})
        return self._hf_error(404, None, "not found")

    def _hf_model_info(self, repo: Repo, revision: str, params: dict[str, str]) -> None:
        commit = repo.resolve(revision)
        if commit is None:
            return self._hf_error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        blobs = params.get("blobs", "").lower() in ("1", "true")
        siblings = []
        for f in repo.files_at(commit).values():
            sib: dict = {"rfilename": f.path}
            if blobs:
                sib.update(size=f.size, blobId=f.oid)
                if f.lfs:
                    sib["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": len(f.pointer)}
            siblings.append(sib)
        author = repo.repo_id.split("/")[0] if "/" in repo.repo_id else None
        info = {
            "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "author": author,
            "sha": commit,
            "lastModified": _FIXED_DATE,
            "createdAt": _FIXED_DATE,
            "private": False,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            **(_GGUF_CARD if any(p.endswith(".gguf") for p in repo.files_at(commit)) else _SAFETENSORS_CARD),
            "siblings": siblings,
            "spaces": [],
            "usedStorage": repo.total_size,
        }
        if repo.params:
            info["safetensors"] = {"parameters": dict(repo.params), "total": sum(repo.params.values())}
        self._json(info)

    def _hf_tree(self, repo: Repo, revision: str, base: str, params: dict[str, str]) -> None:
        commit = repo.resolve(revision)
        if commit is None:
            return self._hf_error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        recursive = params.get("recursive", "").lower() in ("1", "true")
        expand = params.get("expand", "").lower() in ("1", "true")
        prefix = base + "/" if base else ""
        dirs = repo.dirs(commit)
        if base and base not in dirs:
            return self._hf_error(404, "EntryNotFound", f"{base} does not exist on {revision}", commit)

        def wanted(path: str) -> bool:
            if not path.startswith(prefix):
                return False
            return recursive or "/" not in path[len(prefix):]

        entries = []
        for d in dirs:
            if wanted(d):
                entries.append({"type": "directory", "oid": hashlib.sha1(f"{commit}:{d}".encode()).hexdigest(),
                                "size": 0, "path": d})
        for f in repo.files_at(commit).values():
            if wanted(f.path):
                e: dict = {"type": "file", "oid": f.oid, "size": f.size, "path": f.path}
                if f.lfs:
                    e["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": len(f.pointer)}
                if expand:
                    e["lastCommit"] = {"id": commit, "title": "Upload model", "date": _FIXED_DATE}
                entries.append(e)
        entries.sort(key=lambda e: e["path"])
        self._json(entries)

    def _hf_resolve(self, repo: Repo, revision: str, path: str) -> None:
        commit = repo.resolve(revision)
        if commit is None:
            return self._hf_error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        f = repo.files_at(commit).get(path)
        if f is None:
            return self._hf_error(404, "EntryNotFound", f"{path} does not exist on {revision}", commit)
        etag = f.sha256 if f.lfs else f.blob_sha1
        headers = {"X-Repo-Commit": commit, "ETag": f'"{etag}"'}
        if f.lfs:
            headers["X-Linked-Etag"] = f'"{f.sha256}"'
            headers["X-Linked-Size"] = str(f.size)
        self._serve_file(repo, f, headers)

    # -- ModelScope

    def _ms_api(self, segments: list[str], params: dict[str, str]) -> None:
        repo, rest = self._match_repo(segments)
        if repo is None:
            return self._ms_error(404, "Model does not exist.")
        if not rest:
            org, _, name = repo.repo_id.rpartition("/")
            return self._ms_ok({"Id": int(repo.commit[:8], 16), "Name": name, "Path": org, "ModelType": [],
                                "Revision": MS_BRANCH, "StorageSize": repo.total_size})
        if rest == ["revisions"]:
            branch = {"Revision": MS_BRANCH, "CommitId": repo.commit, "CreatedAt": _FIXED_EPOCH}
            return self._ms_ok({"RevisionMap": {"Branches": [branch], "Tags": []}})
        if rest == ["repo", "files"]:
            return self._ms_files(repo, params)
        if rest == ["repo"]:
            revision = params.get("Revision") or MS_BRANCH
            commit = repo.resolve(revision)
            if commit is None:
                return self._ms_error(404, f"Revision {revision} does not exist.")
            f = repo.files_at(commit).get((params.get("FilePath") or "").lstrip("/"))
            if f is None:
                return self._ms_error(404, "File does not exist.")
            return self._serve_file(repo, f, {"ETag": f'"{f.sha256}"'})
        return self._ms_error(404, "not found")

    def _ms_files(self, repo: Repo, params: dict[str, str]) -> None:
        revision = params.get("Revision") or MS_BRANCH
        commit = repo.resolve(revision)
        if commit is None:
            return self._ms_error(404, f"Revision {revision} does not exist.")
        recursive = params.get("Recursive", "").lower() in ("1", "true")
        root = (params.get("Root") or "").strip("/")
        prefix = root + "/" if root else ""
        dirs = repo.dirs(commit)
        if root and root not in dirs:
            return self._ms_error(404, f"{root} does not exist.")

        def wanted(path: str) -> bool:
            return path.startswith(prefix) and (recursive or "/" not in path[len(prefix):])

        out = []
        for d in dirs:
            if wanted(d):
                out.append({"Name": d.rsplit("/", 1)[-1], "Path": d, "Type": "tree", "Size": 0,
                            "Revision": commit, "Mode": "40000"})
        for f in repo.files_at(commit).values():
            if wanted(f.path):
                out.append({
                    "Name": f.path.rsplit("/", 1)[-1], "Path": f.path, "Type": "blob", "Size": f.size,
                    "Sha256": f.sha256, "Id": f.oid, "Revision": commit, "CommitId": commit,
                    "CommitMessage": "Upload model", "CommittedDate": _FIXED_EPOCH, "Mode": "100644",
                    "IsLFS": f.lfs,
                })
        out.sort(key=lambda e: e["Path"])
        self._ms_ok({"Files": out, "IsVisual": 0})

    # -- file bytes

    def _serve_file(self, repo: Repo, f: RepoFile, headers: dict[str, str]) -> None:
        key = f"{repo.repo_id}/{f.path}"
        rng = _parse_range(self.headers.get("Range"), f.size)
        if rng == "bad":
            return self._send(416, b"", "text/plain", {"Content-Range": f"bytes */{f.size}", **headers})
        start, end = rng if rng else (0, f.size - 1)
        length = end - start + 1 if f.size else 0
        status = 206 if rng else 200
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        name = f.path.rsplit("/", 1)[-1]
        self.send_header("Content-Disposition", f"inline; filename*=UTF-8''{quote(name)}; filename=\"{name}\"")
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{end}/{f.size}")
        for k, v in headers.items():
            self.send_header(k, v)
        entry = self._begin(status)
        self.end_headers()
        if self.command == "HEAD" or length == 0:
            return self._finish(entry, 0)

        cut, corrupt, throttle = self.state.download_plan(key)
        flip_at = f.size // 2 if corrupt else -1
        client = self.client_address[0]
        sent = 0
        t0 = time.monotonic()
        chunk_size = _CHUNK if not throttle else max(1, min(_CHUNK, throttle // 20 or 1))
        note = ""
        try:
            with f.abspath.open("rb") as fh:
                fh.seek(start)
                pos = start
                while sent < length:
                    want = min(chunk_size, length - sent)
                    if cut is not None:
                        want = min(want, cut - sent)
                        if want <= 0:
                            note = f"cut after {sent}"
                            raise _Cut()
                    data = fh.read(want)
                    if not data:
                        raise OSError(f"{f.abspath} shrank while serving")
                    if pos <= flip_at < pos + len(data):
                        b = bytearray(data)
                        b[flip_at - pos] ^= 0xFF
                        data = bytes(b)
                        note = "corrupted"
                    # Count before writing, so a client that has the bytes never sees a stale counter;
                    # take them back if the write fails.
                    self.state.add_bytes(key, client, len(data))
                    with self.state.lock:
                        entry["sent"] = sent + len(data)
                    try:
                        self.wfile.write(data)
                    except OSError:
                        self.state.add_bytes(key, client, -len(data))
                        raise
                    sent += len(data)
                    pos += len(data)
                    if throttle:
                        ahead = sent / throttle - (time.monotonic() - t0)
                        if ahead > 0:
                            time.sleep(ahead)
        except _Cut:
            self._cut_connection()
            self._finish(entry, sent, note)
            raise
        except OSError:
            self._finish(entry, sent, "client went away")
            raise
        self._finish(entry, sent, note)

    def _cut_connection(self) -> None:
        self.close_connection = True
        try:
            self.wfile.flush()
        except OSError:
            pass
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class HubServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64


def make_server(data_dir: Path, host: str = "127.0.0.1", port: int = 0, *, log: bool = True) -> HubServer:
    """A ready-to-serve hub over every repo under data_dir (port 0 = any free port)."""
    state = HubState(discover_repos(Path(data_dir)), log=log)
    handler = type("BoundHubHandler", (HubHandler,), {"state": state})
    server = HubServer((host, port), handler)
    server.state = state  # type: ignore[attr-defined]
    return server


def server_url(server: HubServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}"


def _import_generate():
    try:
        from .model import generate  # python3 -m sim.hub.server
    except ImportError:  # python3 path/to/server.py: model.py sits next to this file
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from model import generate  # type: ignore[no-redef]
    return generate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="sparkfleet simulated model hub (Hugging Face + ModelScope APIs)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--data", required=True, type=Path, help="serves every DIR/<org>/<name>/ as repo '<org>/<name>'")
    ap.add_argument("--generate", action="append", default=[], metavar="REPO_ID",
                    help="generate this repo under DIR if absent (repeatable)")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--shard-mb", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quiet", action="store_true", help="no per-request log lines")
    args = ap.parse_args(argv)

    args.data.mkdir(parents=True, exist_ok=True)
    for repo_id in args.generate:
        dest = args.data / repo_id
        if not (dest.is_dir() and any(dest.iterdir())):
            _import_generate()(repo_id, dest, shards=args.shards, shard_mb=args.shard_mb, seed=args.seed)
    server = make_server(args.data, args.host, args.port, log=not args.quiet)
    for repo in server.state.repos.values():  # type: ignore[attr-defined]
        sys.stderr.write(f"serving {repo.repo_id} @ {repo.commit} ({len(repo.files)} files, {repo.total_size} bytes)\n")
    sys.stderr.write(f"listening on {server_url(server)}\n")
    sys.stderr.flush()
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
