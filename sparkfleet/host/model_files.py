"""Model operations: the runtime bundle the host helpers run with, and the model's verified files."""

from __future__ import annotations

import io
import json
import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.operations import files

from sparkfleet.contract import paths
from sparkfleet.host.facts import ModelFiles
from sparkfleet.host.state import file_state
from sparkfleet.contract.shared import verify
from sparkfleet.model.manifest import Manifest
from sparkfleet.host.drift import only_on_drift


_UNPACK_CHECKED = (
    'got=$(sha256sum "$UPLOAD" | cut -d" " -f1); '
    '[ "$got" = "$SHA256" ] || { rm -f "$UPLOAD"; echo "runtime bundle $UPLOAD has sha256 $got, not the $SHA256'
    ' the controller built: refused, nothing unpacked (rebuild it: delete the controller\'s .cache/runtime)" >&2;'
    ' exit 1; }; '
    'rm -rf "$TARGET.partial" && mkdir "$TARGET.partial" && tar -xzf "$UPLOAD" -C "$TARGET.partial" && '
    'mv "$TARGET.partial" "$TARGET" && rm -f "$UPLOAD"'
)


@only_on_drift
@operation()
def runtime_bundle(tarball: str, sha256: str):
    """The hub and openai clients unpacked under RUNTIME_DIR/<bundle name>, from an upload whose sha256 is the
    one recorded when the controller built it (checked on the host, before anything is unpacked)."""
    name = Path(tarball).name.removesuffix(".tar.gz")
    target = f"{paths.RUNTIME_DIR}/{name}"
    if (file_state(host, target) or {}).get("type") == "dir":
        host.noop(f"runtime {name} present")
        return
    upload = f"{paths.RUNTIME_DIR}/{name}.tar.gz"
    yield f"mkdir -p {paths.RUNTIME_DIR}"
    yield from files.put._inner(src=tarball, dest=upload)
    yield StringCommand("UPLOAD=" + shlex.quote(upload), "SHA256=" + shlex.quote(sha256),
                        "TARGET=" + shlex.quote(target), "sh -c", QuoteString(_UNPACK_CHECKED))


def runtime_path(tarball: str) -> str:
    return f"{paths.RUNTIME_DIR}/{Path(tarball).name.removesuffix('.tar.gz')}"


@only_on_drift
@operation()
def model_verified(manifest: Manifest, model_dir: str, endpoint: str | None, runtime: str,
                   full_verify: bool = False, peers: list[str] | None = None, pushed_from: str | None = None,
                   model_files: dict | None = None):
    """Exactly the manifest's files in model_dir, each with the hub's hash; only what is not vouched
    for is touched, and entries the manifest does not name (files, symlinks, directories) go.

    Bytes come from `peers` (other Sparks' shares, asked with the fleet token)
    then the hub, or, with `pushed_from` (the controller's verified copy),
    over this SSH connection. `model_files` is the ModelFiles fact when the
    caller already read it.
    """
    state = model_files if model_files is not None else host.get_fact(
        ModelFiles, model_dir=model_dir, record=paths.VERIFIED_RECORD)
    needed = files_needing_work(manifest, state["record"], state["files"], full_verify)
    extra = verify.extras(manifest.entries, state["files"], state.get("others", {}))
    if not needed and not extra:
        host.noop(f"{len(manifest.files)} model files verified in {model_dir}")
        return
    name = Path(model_dir).name
    job_path = f"{paths.MANIFEST_DIR}/{name}.json"
    staging = f"{Path(model_dir).parent}/{paths.STAGING_DIR_NAME}/{name}"
    job = {"manifest": manifest.to_dict(), "model_dir": model_dir, "staging_dir": staging, "endpoint": endpoint,
           "peers": peers or [], "staged": pushed_from is not None}
    yield f"mkdir -p {paths.MANIFEST_DIR}"
    yield from files.put._inner(src=io.StringIO(json.dumps(job, indent=1)), dest=job_path, mode="0644")
    for path in needed if pushed_from is not None else []:
        yield from files.put._inner(src=f"{pushed_from}/{path}", dest=f"{staging}/{path}")
    yield StringCommand(
        f"PYTHONPATH={runtime}", "python3", f"{paths.BIN_DIR}/sparkfleet-fetch", QuoteString(job_path),
        "--env-file", paths.HUB_ENV, "--progress-file", paths.FETCH_PROGRESS,
        *(["--token-file", paths.FLEET_TOKEN] if peers else []),
        *(["--full-verify"] if full_verify else []),
    )


def files_needing_work(manifest: Manifest, record: dict, files: dict, full_verify: bool = False) -> list[str]:
    """Manifest paths whose bytes the verified record does not vouch for (the host module's rule)."""
    return verify.files_needing_work(manifest.entries, record, files, full_verify)


def missing_bytes(manifest: Manifest, needed: list[str]) -> int:
    """Bytes still to download: what the free-disk check must cover."""
    wanted = set(needed)
    return sum(f.size for f in manifest.files if f.path in wanted)
