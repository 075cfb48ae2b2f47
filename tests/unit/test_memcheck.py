"""files/sparkfleet-memcheck, the real helper, against a memory plan the planner wrote: it reads that shape and
applies the planner's own budget rule. It runs in a private mount namespace where /proc/meminfo and
/proc/sys/vm/drop_caches are files of the test (no page cache of this machine is dropped) and `systemctl` is a
stand-in naming which units are active; it skips where `unshare -rm` is not allowed."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from sparkfleet import FILES_DIR
from sparkfleet.contract.formats import memory_plan_json
from sparkfleet.release.plan import plan_hosts
from tests.unit.helpers import host_data

MEMCHECK = FILES_DIR / "sparkfleet-memcheck"
RAG = {"embed": {"recipe": "qwen3-embedding-0.6b"}, "rerank": {"recipe": "qwen3-reranker-0.6b"}}
# 128 GB total, 120 GB available: the chat's 0.88 (112.6 GB) fits, 0.95 (121.6 GB) does not
MEMINFO = "MemTotal:       125000000 kB\nMemFree:        117187500 kB\nMemAvailable:   117187500 kB\n"
SYSTEMCTL = """#!/bin/sh
[ "$1" = is-active ] || exit 1
shift
for unit in "$@"; do case " $ACTIVE " in *" $unit "*) echo active;; *) echo inactive;; esac; done
"""


@pytest.fixture
def memcheck(tmp_path):
    """Runs the helper as a unit's ExecStartPre would: (share, active units) -> (exit status, stdout, stderr)."""
    (tmp_path / "meminfo").write_text(MEMINFO)
    (tmp_path / "drop_caches").write_text("")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "systemctl").write_text(SYSTEMCTL)
    (tmp_path / "bin" / "systemctl").chmod(0o755)
    probe = subprocess.run(["unshare", "-rm", "mount", "--bind", str(tmp_path / "meminfo"), "/proc/meminfo"],
                           capture_output=True, check=False)
    if probe.returncode:
        pytest.skip("unshare -rm (a private mount namespace) is not allowed here")
    plan_file = tmp_path / "memory.json"
    plan_file.write_text(memory_plan_json(plan_hosts([("spark-a", host_data(services=RAG))])[0].memory_plan))

    def run(share: str, *active: str) -> tuple[int, str, str]:
        inner = (f"mount --bind {tmp_path}/meminfo /proc/meminfo && "
                 f"mount --bind {tmp_path}/drop_caches /proc/sys/vm/drop_caches && "
                 f"exec {shlex.quote(sys.executable)} {MEMCHECK} {share} {plan_file}")
        proc = subprocess.run(["unshare", "-rm", "sh", "-c", inner], capture_output=True, text=True, check=False,
                              env={"PATH": f"{tmp_path}/bin:/usr/bin:/bin", "ACTIVE": " ".join(active)})
        return proc.returncode, proc.stdout, proc.stderr

    return run


def test_a_start_that_fits_the_planners_budget_passes(memcheck):
    """The chat model starting beside its two running services: 0.88 + 0.03 + 0.03 = 0.94 <= 0.95."""
    rc, out, err = memcheck("0.88", "sparkfleet-vllm-embed.service", "sparkfleet-vllm-rerank.service")
    assert (rc, err) == (0, ""), err
    assert out == ("sparkfleet-memcheck: MemAvailable 111.8 GiB covers the budget of 104.9 GiB (running: "
                   "sparkfleet-vllm-embed.service 0.03, sparkfleet-vllm-rerank.service 0.03)\n")


def test_a_start_past_the_planners_budget_fails_with_one_line(memcheck):
    """A unit asking 0.1 beside the running chat (0.88) and rerank (0.03): 1.01 > 0.95, read from the plan."""
    rc, out, err = memcheck("0.1", "sparkfleet-vllm.service", "sparkfleet-vllm-rerank.service")
    assert (rc, out) == (1, "")
    assert err.splitlines() == [
        "sparkfleet-memcheck: running units hold 0.91 of the budget 0.95 (sparkfleet-vllm-rerank.service 0.03, "
        "sparkfleet-vllm.service 0.88): this unit's 0.1 does not fit; converge the host (its plan lowers a share) "
        "or stop a service"]


def test_short_memory_fails_with_one_line_naming_the_running_units(memcheck):
    rc, out, err = memcheck("0.95")
    assert (rc, out) == (1, "")
    assert err.splitlines() == [
        "sparkfleet-memcheck: MemAvailable 111.8 GiB < budget 113.2 GiB (gpu_memory_utilization 0.95 x MemTotal "
        "119.2 GiB); running: no other sparkfleet engine: stop other models or containers, or lower "
        "gpu_memory_utilization"]
