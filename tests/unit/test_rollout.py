import pytest

from sparkfleet.fleet.converge import HostResult
from sparkfleet.fleet.rollout import batches, judge

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
