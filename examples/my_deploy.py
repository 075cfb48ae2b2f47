"""An existing pyinfra project that adds Spark serving to its own deploy, with sparkfleet installed.

    pip install sparkfleet          (or `pip install .` from a sparkfleet checkout)
    pyinfra inventory.py my_deploy.py

The stages come from the installed package (`sparkfleet.tasks`), the way pyinfra's
deploy packages are used; sparkfleet's settings go in the hosts' data (inventory or
group_data/), and its defaults (the package's group_data/all.py) fill in the rest.
This repository's deploy.py is the same sequence, importing the stages from tasks/. Each stage's result has
named fields (`sparkfleet.host.run`: `ModelResult`, `ServiceResult`) and the later stages take them by name.
"""

from pyinfra import host, state
from pyinfra.operations import files

from sparkfleet.controller.prepare import prepare
from sparkfleet.fleet.inventory import plan_for
from sparkfleet.tasks.container_toolkit import container_toolkit
from sparkfleet.tasks.guard import guard
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
    model_result = model(plan, facts, prepared)
    service_result = service(plan, facts, model_result=model_result)
    guard(plan)  # what the LAN reaches: the engines listen on loopback
    health(plan, model_result=model_result, service_result=service_result)
    watchdog(plan, model_result=model_result, service_result=service_result)
