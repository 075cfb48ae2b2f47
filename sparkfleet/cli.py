"""`sparkfleet ...` (or `python -m sparkfleet ...`): set up an office, plan, roll out, check and measure a fleet."""

from __future__ import annotations

import argparse
import os
import sys

from sparkfleet import __version__
from sparkfleet.commands import (
    backup,
    bench,
    dashboard,
    doctor,
    drain,
    eval,
    fetch,
    hostkeys,
    init,
    logs,
    plan,
    recipes,
    rekey,
    restore,
    rollback,
    rollout,
    status,
    undrain,
    update,
    upgrade,
    usage,
    users,
)
from sparkfleet.refused import BUG, FAILED, INVALID, Refusal, Refused

# In `sparkfleet --help`'s order. Each: NAME, HELP, arguments(parser), run(args) (sparkfleet/commands/__init__.py).
COMMANDS = (init, hostkeys, rekey, recipes, plan, doctor, status, eval, usage, rollout, upgrade, rollback, fetch, users,
            logs, drain, undrain, update, bench, dashboard, backup, restore)


class Parser(argparse.ArgumentParser):
    """argparse, refusing the way every command refuses: one line naming the problem and where the fix is."""

    def error(self, message: str):
        raise Refused(f"{message} (see `{self.prog} --help`)")


EXIT_CODES = (f"exit status: 0 done; {FAILED} something the command had to reach did not answer, or a check it ran "
              f"failed; {INVALID} refused: bad input (an argument, a setting, the inventory, a file or a name), "
              f"nothing touched; {BUG} a bug in sparkfleet, printed with its traceback (please report it); 130 "
              f"interrupted (Ctrl-C)")


def parser() -> argparse.ArgumentParser:
    top = Parser(prog="sparkfleet", description=__doc__, epilog=EXIT_CODES)
    top.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = top.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        one = sub.add_parser(command.NAME, help=command.HELP)
        command.arguments(one)
        one.set_defaults(func=command.run)
    return top


def refuse(refused: Refusal) -> int:
    """The one way a refusal is printed: `sparkfleet: <its line>` on stderr; its exit code (sparkfleet/refused.py).
    A refusal may quote a hub or a host: each of its lines is printed clean (tables.clean), under a cap wide
    enough for many hosts' lines (each quote is capped where it is made)."""
    from sparkfleet.tables import TEXT_MAX, clean_lines

    print(f"sparkfleet: {clean_lines(refused.line(), 10 * TEXT_MAX)}", file=sys.stderr)
    return refused.code


def bug() -> int:
    """Anything but a refusal that leaves a command is a bug of sparkfleet's, not the user's mistake: its traceback on
    stderr (clean, line by line: its message may quote a host or a hub) and a line saying so; exit `BUG`, as pip's
    `Command.main` prints the traceback of an unexpected error and exits with a code of its own."""
    import traceback

    from sparkfleet.tables import TEXT_MAX, clean_lines

    print(clean_lines(traceback.format_exc().rstrip("\n"), 10 * TEXT_MAX), file=sys.stderr)
    print(f"sparkfleet: this is a bug in sparkfleet {__version__}, not a problem with your input: please report it "
          f"with the traceback above (exit {BUG})", file=sys.stderr)
    return BUG


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
        # A command reaches hosts through pyinfra, whose CLI patches the stdlib with gevent when imported: first,
        # before any command imports an HTTP client (urllib3 imported earlier makes gevent warn). The parser and its
        # refusals above import neither.
        import pyinfra_cli  # noqa: F401

        inventory = getattr(args, "inventory", None) or getattr(args, "target", None)  # bench names it `target`
        if inventory:  # the lock and .cache/ are the inventory's project's, wherever this runs from
            from sparkfleet.controller.inventory import project_for

            with project_for(inventory):
                code = args.func(args)
        else:
            code = args.func(args)
        sys.stdout.flush()
    except Refusal as refused:  # Refused and the project's refusal classes (sparkfleet/refused.py), nothing else
        return refuse(refused)
    except BrokenPipeError:  # `sparkfleet plan --json | head -1`: the reader has gone, so has our output
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's last flush, too
        return 1
    except Exception:  # KeyboardInterrupt (130) and SystemExit (--help, --version) are no Exception: they pass
        return bug()
    return code
