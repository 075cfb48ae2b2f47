"""Stage 1b: the platform the release stands on stays where it was proven: the packages platform_pins names are held
at their versions by an apt pin (sparkfleet/host/pins.py), so no `apt upgrade` moves them under a serving fleet."""

from pyinfra.api import deploy

from sparkfleet.contract import paths
from sparkfleet.host.managed import managed_absent, managed_file
from sparkfleet.host.pins import render_pins
from sparkfleet.release.plan import HostPlan


@deploy("Platform pins")
def platform(plan: HostPlan):
    pins = render_pins(plan.settings.platform_pins)
    if pins:
        managed_file(name="Apt pins of the platform packages (platform_pins)", content=pins,
                     dest=paths.PLATFORM_PINS, mode="0644")
    else:
        managed_absent(name="No apt pins of sparkfleet's (platform_pins is empty)", path=paths.PLATFORM_PINS)
