"""Converge each host of the inventory into a verified vLLM server (the stages in order: `sparkfleet.tasks`)."""

from sparkfleet.tasks import converge

converge()
