"""One simulated fleet for every end-to-end test: brought up clean once per run.

Tests that break something (a GPU fault knob, a reboot) repair it before they end.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = "inventory/sim.py"
HOSTS = ("spark-1", "spark-2", "spark-3")


@dataclass
class Converge:
    returncode: int
    changed: dict[str, list[str]]  # host -> names of operations that changed something
    failed: dict[str, list[str]]  # host -> names of operations that failed
    output: str

    def host_failed(self, host: str) -> bool:
        return bool(self.failed.get(host))


def converge(*extra: str, timeout: float = 1500) -> Converge:
    """`pyinfra -y --json inventory/sim.py deploy.py`, as a user runs it; results per host."""
    proc = subprocess.run([str(ROOT / ".venv/bin/pyinfra"), "-y", "--json", INVENTORY, "deploy.py", *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    changed: dict[str, list[str]] = defaultdict(list, {h: [] for h in HOSTS})
    failed: dict[str, list[str]] = defaultdict(list, {h: [] for h in HOSTS})
    try:
        results = json.loads(proc.stdout)["results"]
    except (ValueError, KeyError, TypeError):
        raise AssertionError(f"pyinfra printed no results (exit {proc.returncode}):\n{proc.stderr[-6000:]}")
    for op in results["operations"]:
        for host in op["success"]:
            changed[host].append(op["name"])
        for host in op["error"]:
            failed[host].append(op["name"])
    return Converge(proc.returncode, changed, failed, proc.stderr)


@pytest.fixture(scope="session")
def sim_fleet():
    """Three simulated Sparks, from a clean slate (whatever an earlier run left is removed)."""
    from sim import fleet

    fleet.down()
    state = fleet.up(hosts=len(HOSTS))
    yield state


@pytest.fixture(scope="session")
def first_converge(sim_fleet):
    return converge()


@pytest.fixture(scope="session")
def hub(sim_fleet):
    return sim_fleet["hub"]["controller_url"]


def ssh(state: dict, host: str, command: str, check: bool = True) -> str:
    """Run a command on a simulated host over real SSH, as an operator would."""
    port = next(h["ssh_port"] for h in state["hosts"] if h["name"] == host)
    proc = subprocess.run(
        ["ssh", "-i", state["ssh_key"], "-p", str(port), "-o", "StrictHostKeyChecking=no",
         "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "root@127.0.0.1", command],
        capture_output=True, text=True, timeout=120,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{host}: {command}: exit {proc.returncode}: {proc.stderr}")
    return proc.stdout.strip()


def api_port(state: dict, host: str) -> int:
    """The 127.0.0.1 port the controller reaches a simulated host's API on."""
    return next(h["api_port"] for h in state["hosts"] if h["name"] == host)


def started_at(state: dict, host: str) -> str:
    """When the host's engine container started: unchanged means not restarted."""
    return ssh(state, host, "docker inspect -f '{{.State.StartedAt}}' vllm")


def run_pytest_infra(*extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "tests/infra", "--inventory", INVENTORY, "-q",
                           "-p", "no:cacheprovider", *extra], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
