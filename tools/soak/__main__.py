"""`python -m tools.soak`: the soak's command. It sits on top of both halves, the decisions (`tools/soak/`) and the
glue to the simulated fleet (`tools/soak_fleet.py`, which imports the decisions), so neither imports the other back
(tests/unit/test_tools.py)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from sparkfleet.refused import FAILED, Refused
from tools import soak


def minutes(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 1 <= number <= 120:
        raise argparse.ArgumentTypeError(f"{value!r}: give the soak's length in minutes, from 1 to 120")
    return number


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tools.soak", description=(soak.__doc__ or "").splitlines()[0])
    parser.add_argument("inventory",
                        help="a simulated fleet's inventory with a front door (inventory/sim_front_door.py)")
    parser.add_argument("--minutes", type=minutes, help=f"the load's length (default {soak.FULL_MINUTES}; "
                                                        f"--short: at most {soak.SHORT_MINUTES})")
    parser.add_argument("--short", action="store_true", help="the short soak: " + ", ".join(soak.SHORT_FAULTS))
    parser.add_argument("--faults", help="a comma-separated subset of the faults, in order (default: all)")
    parser.add_argument("--workers", type=int, default=4, help="concurrent clients (default 4)")
    parser.add_argument("--json", dest="json_path", metavar="PATH", help="write the report as JSON here")
    parser.add_argument("--plot", metavar="PATH", help="write requests over time, faults marked, as a PNG here")
    args = parser.parse_args(argv)
    if args.short and args.minutes and args.minutes > soak.SHORT_MINUTES:
        parser.error(f"--short runs at most {soak.SHORT_MINUTES} minutes")
    if not 1 <= args.workers <= 16:
        parser.error("--workers: from 1 to 16")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import pyinfra_cli  # noqa: F401  (first, as sparkfleet's main() does: gevent patches ssl before clients import it)

    from tools import soak_fleet

    names = soak.SHORT_FAULTS if args.short else tuple(args.faults.split(",")) if args.faults else soak.FULL_FAULTS
    run_minutes = args.minutes or (soak.SHORT_MINUTES if args.short else soak.FULL_MINUTES)
    try:
        report = soak_fleet.run_soak(args.inventory, names, run_s=run_minutes * 60,
                                     baseline_s=soak.BASELINE_S["short" if args.short else "full"],
                                     workers=args.workers)
    except Refused as exc:
        print(f"soak: {exc}", file=sys.stderr)
        return exc.code
    soak.print_report(report)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(report, indent=1) + "\n")
    if args.plot:
        soak.plot_report(report, args.plot)
    failing = soak.failed_goals(report)
    if failing:
        print(f"soak: goals not met: {', '.join(failing)}", file=sys.stderr)
        return FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
