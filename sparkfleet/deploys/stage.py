"""Prepare each host's planned release beside the running one, which keeps serving (`sparkfleet.tasks.stage`)."""

from sparkfleet.tasks import stage

stage()
