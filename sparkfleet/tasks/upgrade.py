"""`sparkfleet upgrade`'s step on one host, drained: the apt pins as the inventory names them, a refusal of any new
kernel or driver a refused_* setting names (before anything is installed), the simulated upgrade installed exactly
(each package at its checked version, refused if apt offers anything else right before: `checked_upgrade`), and a
reboot when a kernel or driver changed or the host asks for one (pyinfra's server.reboot waits for SSH again).
The converge and its health gate come after, in their own run (deploy.py): its facts are read after the reboot."""

from pyinfra import host, state
from pyinfra.api import StringCommand, deploy
from pyinfra.operations import server

from sparkfleet.contract import paths
from sparkfleet.controller.inventory import plan_for
from sparkfleet.host.facts import Unreadable
from sparkfleet.host.pins import render_pins
from sparkfleet.host.run import as_the_host_runs
from sparkfleet.host.upgrade import (
    REBOOT_OP,
    REFUSED_OP,
    UPGRADE_OP,
    UpgradeSimulation,
    checked_upgrade,
    needs_reboot,
    refused_changes,
)
from sparkfleet.release.plan import HostPlan
from sparkfleet.tasks.platform import platform
from sparkfleet.tasks.preflight import failing

REBOOT_TIMEOUT_S = 900  # a Spark's firmware and DGX OS boot in a few minutes


def refuse(lines: list[str]) -> None:
    """The host's last operation: print why and fail, so nothing is installed and the host stays as it was."""
    failing(f"{REFUSED_OP}: {'; '.join(lines)}", lines)


# refusal: host-only: what apt would change is simulated on the host (UpgradeSimulation)
@deploy("Platform upgrade")
def platform_upgrade(plan: HostPlan) -> None:
    platform(plan)
    sim = host.get_fact(UpgradeSimulation, pins=render_pins(plan.settings.platform_pins))  # as platform() writes
    if isinstance(sim, Unreadable):
        return refuse([sim.line(host.name)])
    refused = refused_changes(host.name, plan.settings, sim.changes, in_group=plan.group is not None)
    if refused:
        return refuse(refused)
    if sim.changes:
        checked_upgrade(name=UPGRADE_OP, changes=sim.changes)
    if sim.changes or sim.reboot_required:
        planned, target = needs_reboot(sim), host._get_module()

        def wanted() -> bool:  # after the upgrade ran: any package's postinst may have asked for one
            return planned or as_the_host_runs(target, StringCommand("test", "-e", paths.REBOOT_REQUIRED))[0]

        server.reboot(name=REBOOT_OP, reboot_timeout=REBOOT_TIMEOUT_S, _if=wanted)


def upgrade(plan: HostPlan | None = None) -> None:
    """The current host's upgrade step (the inventory's plan for it unless `plan` is given)."""
    platform_upgrade(plan_for(state, host) if plan is None else plan)
