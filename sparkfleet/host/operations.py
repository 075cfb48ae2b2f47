"""Custom pyinfra operations: each ensures one thing, and yields nothing when it holds."""

from __future__ import annotations

import hashlib
import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import OperationError, QuoteString, StringCommand, operation
from pyinfra.facts.files import Sha1File
from pyinfra.operations import files

from sparkfleet.host import paths
from sparkfleet.host.facts import (
    DockerImagePresent,
    JsonFile,
    KeyringFingerprints,
    ModelDirs,
)


@operation()
def apt_keyring(src: str, dest: str, fingerprint: str):
    """A keyring at dest holding the key with this fingerprint, fetched from src and checked first."""
    if fingerprint in host.get_fact(KeyringFingerprints, path=dest):
        host.noop(f"{dest} holds key {fingerprint}")
        return
    script = (
        'set -e; tmp=$(mktemp); trap \'rm -f "$tmp" "$tmp.gpg"\' EXIT; '
        'curl -fsSL --retry 3 "$SRC" -o "$tmp"; '
        'if grep -q "BEGIN PGP" "$tmp"; then gpg --dearmor < "$tmp" > "$tmp.gpg"; else cp "$tmp" "$tmp.gpg"; fi; '
        'gpg --show-keys --with-colons "$tmp.gpg" | awk -F: \'$1 == "fpr" {print $10}\' | grep -qx "$FPR" || '
        '{ echo "the key at $SRC is not $FPR: check toolkit_key_url and toolkit_key_fingerprint" >&2; exit 1; }; '
        'install -D -m 0644 "$tmp.gpg" "$DEST"'
    )
    yield StringCommand(
        "SRC=" + shlex.quote(src), "FPR=" + fingerprint, "DEST=" + shlex.quote(dest),
        "sh -c", QuoteString(script),
    )


@operation()
def docker_nvidia_runtime():
    """daemon.json names the nvidia runtime; nvidia-ctk merges it, keeping every other key."""
    daemon = host.get_fact(JsonFile, path=paths.DAEMON_JSON) or {}
    if "__invalid__" in daemon:
        raise OperationError(
            f"{paths.DAEMON_JSON} is not valid JSON: fix it by hand; sparkfleet will not overwrite it"
        )
    if "nvidia" in (daemon.get("runtimes") or {}):
        host.noop("docker already has the nvidia runtime")
        return
    yield "nvidia-ctk runtime configure --runtime=docker"


@operation()
def image_loaded(image: str, archive: str):
    """The engine image present in the host's Docker, loaded from a controller-side archive if missing."""
    if host.get_fact(DockerImagePresent, image=image):
        host.noop(f"{image} present")
        return
    upload = f"/var/lib/sparkfleet/{Path(archive).name}"
    yield from files.put._inner(src=archive, dest=upload)
    yield StringCommand("docker load -i", QuoteString(upload), "&& rm -f", QuoteString(upload))


@operation()
def old_models_removed(model_root: str, keep: list[str]):
    """Model directories beyond the kept releases removed (never one in `keep`)."""
    present = host.get_fact(ModelDirs, model_root=model_root)
    stale = [d for d in present if d not in keep]
    if not stale:
        host.noop(f"{len(present)} model directories, all kept")
        return
    for directory in stale:
        yield StringCommand("rm -rf", QuoteString(directory))


@operation()
def release_kept_for_rollback(unit_text: str, env_text: str):
    """Before a new unit or environment replaces the running one, keep the running release aside."""
    have_unit = host.get_fact(Sha1File, path=paths.UNIT_PATH)
    have_env = host.get_fact(Sha1File, path=paths.ENGINE_ENV)
    changing = have_unit not in (None, _sha1(unit_text)) or have_env not in (None, _sha1(env_text))
    if not have_unit or not changing:
        host.noop("no running release is being replaced")
        return
    yield (f"mkdir -p {paths.PREVIOUS_DIR} && cp -p {paths.UNIT_PATH} {paths.ENGINE_ENV} {paths.RELEASE_FILE} "
           f"{paths.PREVIOUS_DIR}/")


def _sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


@operation()
def previous_release_restored(previous: dict, current: dict):
    """Swap the kept release with the running one (so a second rollback returns), then restart."""
    if previous.get("release_id") == current.get("release_id"):
        host.noop(f"release {current.get('release_id')} is already the running one")
        return
    gone = f"the previous model directory {previous['model_dir']} is gone: roll forward instead"
    yield f"test -d {shlex.quote(previous['model_dir'])} || {{ echo {shlex.quote(gone)} >&2; exit 1; }}"
    for live in (paths.UNIT_PATH, paths.ENGINE_ENV, paths.RELEASE_FILE):
        kept = f"{paths.PREVIOUS_DIR}/{Path(live).name}"
        yield f"cp -p {live} {kept}.swap && cp -p {kept} {live} && mv {kept}.swap {kept}"
    yield f"systemctl daemon-reload && systemctl restart {paths.UNIT_NAME}"


@operation(is_idempotent=False)
def health_gate(served_name: str, api_host: str, port: int, tools: bool, timeout_s: int, runtime: str):
    """The service answers: /health, /v1/models, a chat completion, a tool call. Else the journal."""
    check = " ".join([
        f"PYTHONPATH={runtime} python3 {paths.BIN_DIR}/sparkfleet-health",
        "--host", "127.0.0.1" if api_host in ("0.0.0.0", "::") else api_host, "--port", str(port),
        "--served-name", shlex.quote(served_name), "--timeout", str(timeout_s),
        "--env-file", paths.ENGINE_ENV, "--unit", paths.UNIT_NAME, *(["--tools"] if tools else []),
    ])
    yield (f"{check} || {{ echo '--- last 50 lines of {paths.UNIT_NAME}:' >&2; "
           f"journalctl -u {paths.UNIT_NAME} -n 50 --no-pager >&2; exit 1; }}")
