"""One way for a command to refuse: `raise Refused(line)`, anywhere under a command; `sparkfleet.cli.main` catches it,
prints `sparkfleet: <line>` on stderr and exits with its code. Imports nothing, so any layer may raise it.

The refusal family is `Refusal`: `Refused` and the project's own error classes that are refusals by design (a
setting, the inventory, the lock, the secrets file, a recipe file, bad input to drain, a front door that did not
answer, ...) derive from it, and `cli.main` catches that one base class. Nothing else becomes a refusal: a built-in
exception (`KeyError`, `FileNotFoundError`, `ValueError`, ...) or a library's that leaves a command is a bug in
sparkfleet, printed with its traceback and exit code 3 (`BUG`). Domain code that has a message for the user raises
a refusal, never a built-in exception to carry it.

The exit-code rule: 2 (`INVALID`) when the input is refused before anything was touched (an argument, a setting,
an inventory, a name, a file); 1 (`FAILED`) when something the command had to reach did not answer (a host, a hub,
a front door) or a check it ran failed. The line names the problem and, where there is one, the fix."""

from __future__ import annotations

INVALID = 2
FAILED = 1
BUG = 3  # not a refusal: an exception that is no Refusal left a command (cli.main prints its traceback)


class Refusal(Exception):
    """The refusal family: a class deriving from it (beside its built-in base, e.g. `class SettingsError(ValueError,
    Refusal)`) is printed by `cli.main` as `sparkfleet: <line()>` and exits with `code`. `heading`, when set, is the
    line printed above the message's own lines (settings: "invalid settings")."""

    code: int = INVALID
    heading: str | None = None

    def line(self) -> str:
        """What follows `sparkfleet: ` (one line, or a heading and one line per problem)."""
        return f"{self.heading}:\n{self}" if self.heading else str(self)


class Refused(Refusal):
    """A command's refusal: its message (one line naming the problem and the fix) and its exit code."""

    def __init__(self, message: str, code: int = INVALID):
        super().__init__(message)
        self.message = message
        self.code = code

    def __str__(self) -> str:
        return self.message
