"""`sparkfleet undrain INVENTORY HOST`: put a drained host back on every front door (drain.py's run, undone)."""

from __future__ import annotations

from sparkfleet.commands import drain

NAME = "undrain"
HELP = "put a drained HOST back on every front door"
arguments = drain.arguments


def run(args) -> int:
    return drain.door(args, drained=False)
