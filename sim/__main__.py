"""`python -m sim ...`: the simulated fleet (a separate room: sparkfleet never imports it)."""

import sys

from sim.fleet.cli import main

sys.exit(main(sys.argv[1:]))
