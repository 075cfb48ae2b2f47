"""The controller's own verified copy of a model, for air-gapped offices (model_source = "controller").

Made with the same verifier the hosts run (files/sparkfleet-fetch), from the
hub the controller can reach; once verified it needs no hub again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from sparkfleet import FILES_DIR
from sparkfleet.contract.shared import verify
from sparkfleet.model.hubs import cache_dir
from sparkfleet.model.manifest import Manifest


class ControllerCopyError(RuntimeError):
    pass


_copying = threading.Lock()  # pyinfra plans hosts concurrently: one copy at a time


def controller_copy(manifest: Manifest, copy_root: str | None, endpoint: str | None, *, token: str | None) -> Path:
    """A directory on the controller holding every manifest file, verified; fetched if needed.

    `token` (hub_token) reaches the verifier in its environment, as the hub clients read it: never on its
    command line, in the job file or in a log; a gated model needs it."""
    root = Path(copy_root) if copy_root else cache_dir() / "models"
    model_dir = verify.inside(root, root / manifest.dir_name)
    staging = verify.inside(root, root / verify.STAGING_NAME / manifest.dir_name)
    job = root / f".{manifest.dir_name}.job.json"
    root.mkdir(parents=True, exist_ok=True)
    with _copying:
        job.write_text(json.dumps({"manifest": manifest.to_dict(), "model_dir": str(model_dir),
                                   "staging_dir": str(staging), "endpoint": endpoint}))
        proc = subprocess.run([sys.executable, str(FILES_DIR / "sparkfleet-fetch"), str(job),
                               "--env-file", "/nonexistent"], capture_output=True, text=True, env=_hub_env(token))
    if proc.returncode != 0:
        raise ControllerCopyError(
            f"the controller has no verified copy of {manifest.repo} in {model_dir} and cannot fetch it: "
            f"{proc.stderr.strip()[-800:]}")
    return model_dir


def _hub_env(token: str | None) -> dict[str, str]:
    """The verifier's environment: the controller's, with the hub token under both clients' names (hub.env's)."""
    return {**os.environ, **({"HF_TOKEN": token, "MODELSCOPE_API_TOKEN": token} if token else {})}
