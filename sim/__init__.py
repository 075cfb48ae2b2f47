"""The simulated fleet and its services (a separate room: sparkfleet never imports it)."""
import os


def select_fleet(argv: list[str]) -> list[str]:
    """Take `--fleet NAME` (or `--fleet=NAME`) out of the arguments into SPARKFLEET_SIM_FLEET, which sim.fleet
    reads at import: call before importing it. Returns the other arguments."""
    rest, args = [], iter(argv)
    for arg in args:
        if arg == "--fleet":
            os.environ["SPARKFLEET_SIM_FLEET"] = next(args, "")
        elif arg.startswith("--fleet="):
            os.environ["SPARKFLEET_SIM_FLEET"] = arg.partition("=")[2]
        else:
            rest.append(arg)
    return rest
