"""`python -m sim [--fleet NAME] hub publish|unpublish [REPO]`: move the running sim hub's branch.

`publish` makes a new commit of REPO (default: the sim's chat model) with README.md changed and prints its id;
older commits are still served by their id. `unpublish` puts the branch back on the generated commit. Both ask
the hub's admin endpoint (`/_sim/publish`, `/_sim/unpublish`) at the address the fleet's state.json gives.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request

from sim.fleet._util import SimError
from sim.fleet.fleet import load_state


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim hub", description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=("publish", "unpublish"))
    ap.add_argument("repo", nargs="?", help="the repository (default: the sim's chat model)")
    args = ap.parse_args(argv)
    try:
        hub = load_state()["hub"]
    except SimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    body = json.dumps({"repo": args.repo or hub["repo"]}).encode()
    request = urllib.request.Request(f"{hub['controller_url']}/_sim/{args.action}", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            answer = json.load(reply)
    except urllib.error.HTTPError as exc:
        print(f"error: the sim hub answered HTTP {exc.code}: {exc.read()[:300].decode(errors='replace')}",
              file=sys.stderr)
        return 2 if exc.code == 400 else 1
    except OSError as exc:
        print(f"error: the sim hub at {hub['controller_url']} did not answer ({exc}): `python -m sim up`",
              file=sys.stderr)
        return 1
    print(answer["commit"])
    print(f"{answer['repo']}: branch {answer['previous']} -> {answer['commit']}", file=sys.stderr)
    return 0
