"""`--batch`: a count of hosts ("2") or a share of the fleet ("25%"), never 0. Its own light module: the command
line checks it before any plan (sparkfleet/commands/common.py `batch`), and `fleet/rollout.py` `batches` splits by it."""

from __future__ import annotations

import math
import re


def batch_size(batch: str, hosts: int) -> int:
    """Hosts (or units) per batch out of `hosts`; ValueError naming the fix for anything but N or N%."""
    match = re.fullmatch(r"(\d+)(%?)", batch.strip())
    if not match or int(match[1]) == 0:
        raise ValueError(f"--batch {batch!r}: give a number of hosts (e.g. 2) or a percentage (e.g. 25%)")
    return max(1, math.floor(hosts * int(match[1]) / 100)) if match[2] else int(match[1])
