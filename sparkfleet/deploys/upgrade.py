"""Upgrade each host's platform packages within the apt pins, rebooting where needed (`sparkfleet.tasks.upgrade`)."""

from sparkfleet.tasks.upgrade import upgrade

upgrade()
