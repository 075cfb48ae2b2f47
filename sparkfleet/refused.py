"""One way for a command to refuse: `raise Refused(line)`, anywhere under a command; `sparkfleet.cli.main` catches it,
prints `sparkfleet: <line>` on stderr and exits with its code. Imports nothing, so any layer may raise it.

The exit-code rule: 2 (`INVALID`) when the input is refused before anything was touched (an argument, a setting,
an inventory, a name, a file); 1 (`FAILED`) when something the command had to reach did not answer (a host, a hub,
a front door) or a check it ran failed. The line names the problem and, where there is one, the fix."""

from __future__ import annotations

INVALID = 2
FAILED = 1


class Refused(Exception):
    """A command's refusal: its message (one line naming the problem and the fix) and its exit code."""

    def __init__(self, message: str, code: int = INVALID):
        super().__init__(message)
        self.message = message
        self.code = code

    def __str__(self) -> str:
        return self.message
