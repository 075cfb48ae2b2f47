"""A rollout's first phase on one host: its planned release made ready beside the running one while it serves."""

from pyinfra import host, state
from pyinfra.api import deploy

from sparkfleet.controller.prepare import Prepared
from sparkfleet.controller.progress import watch
from sparkfleet.host.preflight import HostFacts
from sparkfleet.host.run import ModelResult
from sparkfleet.release.plan import HostPlan
from sparkfleet.tasks.model import helpers, model_files
from sparkfleet.tasks.service import engine_image


@deploy("Staging")
def staging(plan: HostPlan, facts: HostFacts, prepared: Prepared) -> ModelResult:
    """The model stage's files and the service stage's image, nothing that a running engine reads: no unit, engine
    environment, release record, memory plan or serving file, and no restart."""
    helpers()
    fetched = model_files(plan, facts, prepared)
    watch(state, host, fetch=fetched.fetched.will_change)  # the fetch's progress, as a converge shows it
    engine_image(plan)
    return fetched
