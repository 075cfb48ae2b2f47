import pytest

from sparkfleet.fleet import rollout as rollout_module
from sparkfleet.fleet.converge import HostResult
from sparkfleet.fleet.rollout import batches, judge, rollout

HOSTS = ["a", "b", "c", "d", "e"]


def test_batches_by_count_and_share():
    assert batches(HOSTS, "1") == [["a"], ["b"], ["c"], ["d"], ["e"]]
    assert batches(HOSTS, "2") == [["a", "b"], ["c", "d"], ["e"]]
    assert batches(HOSTS, "40%") == [["a", "b"], ["c", "d"], ["e"]]
    assert batches(HOSTS, "10%") == [["a"], ["b"], ["c"], ["d"], ["e"]]  # never an empty batch
    assert batches(HOSTS, "100%") == [HOSTS]


def test_canary_goes_alone_first():
    assert batches(HOSTS, "2", canary=True) == [["a"], ["b", "c"], ["d", "e"]]


@pytest.mark.parametrize("bad", ["0", "-1", "x", "0%", ""])
def test_bad_batch_is_refused(bad):
    with pytest.raises(ValueError, match="give a number of hosts"):
        batches(HOSTS, bad)


def test_judge():
    assert judge(HostResult("a", changed=["unit"])) == "converged"
    assert judge(HostResult("a")) == "unchanged"
    assert judge(HostResult("a", failed=["health"])) == "failed"
    assert judge(HostResult("a", connected=False, failed=["unreachable over SSH"])) == "unreachable"


def fake_deploy(monkeypatch, results: dict):
    """run_deploy replaced: deploy.py gives `results`; rollback.py records which hosts it ran on."""
    rolled_back = []

    def run_deploy(inventory, hosts, data=None, deploy_file="deploy.py"):
        if deploy_file == "rollback.py":
            rolled_back.extend(hosts)
            return {h: HostResult(h, changed=["restored"], health_gate="passed") for h in hosts}
        return {h: results[h] for h in hosts}

    monkeypatch.setattr(rollout_module, "run_deploy", run_deploy)
    return rolled_back


def test_a_failed_health_gate_is_rolled_back_by_its_result(monkeypatch):
    rolled_back = fake_deploy(monkeypatch, {"a": HostResult("a", failed=["vLLM up"], health_gate="failed")})
    [report] = rollout("inv.py", ["a"], {"a": ("old", "new")}, log=lambda m: None)
    assert rolled_back == ["a"]
    assert (report.result, report.new_release) == ("rolled back", "old")


def test_another_failure_is_not_rolled_back_whatever_its_name(monkeypatch):
    rolled_back = fake_deploy(monkeypatch, {"a": HostResult("a", failed=["Q answers on port 8000"])})
    [report] = rollout("inv.py", ["a"], {"a": ("old", "new")}, log=lambda m: None)
    assert rolled_back == [] and report.result == "failed"
