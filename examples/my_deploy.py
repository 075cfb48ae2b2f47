"""An existing pyinfra project that adds Spark serving to its own deploy, with sparkfleet installed.

    pip install sparkfleet          (or `pip install .` from a sparkfleet checkout)
    pyinfra inventory.py my_deploy.py

The stages come from the installed package (`sparkfleet.tasks`), the way pyinfra's
deploy packages are used; sparkfleet's settings go in the hosts' data (inventory or
group_data/), and its defaults (the package's group_data/all.py) fill in the rest.
This repository's deploy.py is the same sequence, importing the stages from tasks/.
"""

from pyinfra import host, state
from pyinfra.operations import files

from sparkfleet.controller.prepare import prepare
from sparkfleet.fleet.inventory import plan_for
from sparkfleet.tasks.container_toolkit import container_toolkit
from sparkfleet.tasks.health import health
from sparkfleet.tasks.model import model
from sparkfleet.tasks.preflight import preflight
from sparkfleet.tasks.service import service
from sparkfleet.tasks.watchdog import watchdog

files.directory(name="The project's own operations run as before", path="/srv/my-project")

plan = plan_for(state, host)
facts = preflight(plan)
if facts:
    prepared = prepare(plan, facts)
    container_toolkit(plan, arch=facts.arch)
    runtime, fetched = model(plan, facts, prepared)
    started, keep = service(plan, facts, model_changed=fetched.will_change)
    health(plan, runtime=runtime, started=started, keep=keep)
    watchdog(plan, runtime=runtime, started=started)
