"""Stage 4: the systemd unit that runs vLLM in Docker; restarted only when something changed."""

import io
import json

from pyinfra.api import deploy
from pyinfra.operations import files, systemd

from sparkfleet import paths
from sparkfleet.plan import HostPlan


@deploy("Service")
def service(plan: HostPlan):
    """Returns the operations whose change means the service was (re)started."""
    env = files.put(name="Engine environment (root-only)", src=io.StringIO(plan.render_engine_env()),
                    dest=paths.ENGINE_ENV, mode="0600")
    unit = files.put(name="vLLM unit", src=io.StringIO(plan.render_unit()), dest=paths.UNIT_PATH, mode="0644")
    files.put(name="Release record", src=io.StringIO(json.dumps(plan.release_record(), indent=2) + "\n"),
              dest=paths.RELEASE_FILE, mode="0644")
    changed = unit.will_change or env.will_change
    started = systemd.service(
        name="vLLM service enabled and running",
        service=paths.UNIT_NAME, running=True, enabled=True,
        restarted=changed, daemon_reload=unit.will_change,
    )
    return started
