"""`python -m sim.fleet ...`: the same as `python -m sim ...`, run afresh (this package is imported before
this file runs, too early for a --fleet argument to choose the fleet's names)."""
import os
import sys

os.execv(sys.executable, [sys.executable, "-m", "sim", *sys.argv[1:]])
