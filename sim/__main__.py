"""`python -m sim [--fleet NAME] ...`: the simulated fleet (a separate room: sparkfleet never imports it)."""

import sys

from sim import select_fleet

argv = select_fleet(sys.argv[1:])
try:
    from sim.fleet.cli import main  # after select_fleet: the fleet's names are fixed at import
    from sim.hub.cli import main as hub_main  # `hub publish|unpublish [REPO]`: the running hub's branch
except RuntimeError as e:  # SimError: a bad fleet name
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)

sys.exit(hub_main(argv[1:]) if argv[:1] == ["hub"] else main(argv))
