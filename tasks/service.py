"""Stage 4: the systemd unit that runs vLLM in Docker; restarted only when something changed."""

import io
import json

from pyinfra.api import deploy
from pyinfra.operations import files, systemd

from sparkfleet.host import paths
from sparkfleet.host.operations import (
    image_loaded,
    release_kept_for_rollback,
    secret_file,
)
from sparkfleet.host.preflight import HostFacts
from sparkfleet.host.serving import start_limit_cleared
from sparkfleet.release.plan import HostPlan


@deploy("Service")
def service(plan: HostPlan, facts: HostFacts, model_changed: bool):
    """Returns the service operation (its change means a (re)start) and the model dirs to keep.

    The installed release record comes from preflight, which stopped the host if
    it was not a readable JSON object: it is built on here, never guessed.
    """
    s = plan.settings
    if s.engine_image_archive:
        image_loaded(name=f"Engine image {s.engine_image} (from the controller's archive if missing)",
                     image=s.engine_image, archive=s.engine_image_archive)
    unit_text = plan.render_unit()
    installed = facts.release.value or {}
    release_kept_for_rollback(name="Running release kept for rollback (without its secrets)",
                              installed_release=installed.get("release_id"), new_release=plan.release_id,
                              unit_text=unit_text)
    env = secret_file(name="Engine environment (root-only)", dest=paths.ENGINE_ENV, content=plan.render_engine_env())
    unit = files.put(name="vLLM unit", src=io.StringIO(unit_text), dest=paths.UNIT_PATH, mode="0644")
    record = plan.release_record(installed)
    files.put(name="Release record", src=io.StringIO(json.dumps(record, indent=2) + "\n"),
              dest=paths.RELEASE_FILE, mode="0644")
    start_limit_cleared(name="Start limit of a failed unit reset (a converge tries again)", unit=paths.UNIT_NAME)
    started = systemd.service(
        name="vLLM service enabled and running",
        service=paths.UNIT_NAME, running=True, enabled=True,
        restarted=unit.will_change or env.will_change or model_changed, daemon_reload=unit.will_change,
    )
    return started, record["model_history"]
