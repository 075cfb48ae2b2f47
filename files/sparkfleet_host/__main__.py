"""`python3 /opt/sparkfleet/bin/sparkfleet_host ARGS` (or `python3 -m sparkfleet_host ARGS`): cli.py's commands."""

import os
import sys

if not __package__:  # run as a directory: Python put the package itself first on the path, not the folder holding it
    sys.path[0] = os.path.dirname(os.path.abspath(sys.path[0]))

from sparkfleet_host.cli import main  # noqa: E402  (after the path is the package's parent)

main(sys.argv[1:])
