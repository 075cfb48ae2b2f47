"""Converge DGX Sparks into verified vLLM servers.

    pyinfra inventory/office.py deploy.py

The stages, in order, are `sparkfleet.tasks.converge` (sparkfleet/tasks/__init__.py): preflight (a host that
fails it is left untouched, and so is every member of its tensor-parallel group), container toolkit, model,
service, guard, health, watchdog, and the front door on hosts of the group `front_door`. Installed, the same
deploy ships as `sparkfleet/deploys/deploy.py`; `sparkfleet rollout` runs this file from a checkout.
"""

from sparkfleet.tasks import converge

converge()
