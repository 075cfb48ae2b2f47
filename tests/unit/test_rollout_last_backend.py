"""A rollout never drains the last backend in rotation of a model out of the front door (issue 35): a door still
routing model M to spark-1 alone (converged from an older inventory) while the inventory serves M on spark-2 and
spark-3 too is refused before any host is touched, naming the model, the host and the fix; a model no other host
serves is drained as before (nothing could keep it)."""

from __future__ import annotations

from tests.unit.helpers import NoAddress

import pytest

from sparkfleet.fleet import rollout as rollout_module
from sparkfleet.fleet.converge import HostResult
from sparkfleet.fleet.front_door.runtime import in_rotation
from sparkfleet.fleet.rollout import emptied_backends, last_backend_problems
from sparkfleet.refused import Refused

M = "Qwen3.5-35B-A3B"
SERVES = {"spark-1": M, "spark-2": M, "spark-3": M}
# the stale door (an older inventory's): its default backend routes M to spark-1 alone, chat_1 another model to
# spark-2 and spark-3, which serve M now (chat_1's check asks for the other model: spark-2 fails it), spark-3 set aside
STAT = """# pxname,svname,qcur,qmax,scur,smax,status,weight
api,FRONTEND,,,1,3,OPEN,
engines,spark-1,0,0,0,1,UP,1
engines,BACKEND,0,0,0,3,UP,1
chat_1,spark-2,0,0,0,1,DOWN 0/2,1
chat_1,spark-3,0,0,0,1,MAINT,1
chat_1,BACKEND,0,0,0,3,DOWN,1
model_1,spark-3,0,0,0,1,UP,1
"""


def test_in_rotation_reads_every_backend_of_show_stat():
    assert in_rotation(STAT) == {"engines": {"spark-1"}, "chat_1": set(), "model_1": {"spark-3"}}


def test_the_backends_a_batch_would_leave_empty():
    rotation = in_rotation(STAT)
    assert emptied_backends(rotation, ["spark-1"]) == {"engines": {"spark-1"}}
    assert emptied_backends(rotation, ["spark-2"]) == {}  # out already: draining it empties nothing more
    assert emptied_backends(rotation, ["spark-1", "spark-3"]) == {"engines": {"spark-1"}, "model_1": {"spark-3"}}


def test_a_stale_door_refuses_to_drain_the_last_backend_of_a_model_other_hosts_serve():
    [line] = last_backend_problems({"door-1": in_rotation(STAT)}, ["spark-1"], SERVES, "inventory/sim.py")
    assert line == (f"front door door-1: draining spark-1 leaves its backend engines ({M}) with no server in "
                    f"rotation, though spark-2, spark-3 serve {M} too: converge the front door first "
                    "(pyinfra -y inventory/sim.py deploy.py --limit door-1), or bring them back in rotation, "
                    "then roll out")


def test_a_model_only_the_batch_serves_is_drained_as_before():
    only = {"spark-1": M, "spark-2": "other", "spark-3": "other"}
    assert last_backend_problems({"door-1": in_rotation(STAT)}, ["spark-1"], only, "inv.py") == []
    assert last_backend_problems({"door-1": None}, ["spark-1"], SERVES, "inv.py") == []  # a door that did not answer


def test_a_model_another_backend_still_carries_is_no_problem():
    """A RAG route's only server drained (what it serves goes: nothing else serves it), and the chat model stays
    behind the default backend's other servers; a stale route's server of the same model carries it too."""
    stat = ("# pxname,svname,qcur,qmax,scur,smax,status,weight\n" + "".join(
        f"engines,{h},0,0,0,1,UP,1\n" for h in SERVES) + "model_1,spark-1,0,0,0,1,UP,1\n")
    assert last_backend_problems({"door-1": in_rotation(stat)}, ["spark-1"], SERVES, "inv.py") == []
    assert last_backend_problems({"door-1": in_rotation(stat)}, list(SERVES), SERVES, "inv.py") == []  # all out
    two = ("# pxname,svname,qcur,qmax,scur,smax,status,weight\n"
           "engines,spark-1,0,0,0,1,UP,1\nchat_1,spark-2,0,0,0,1,UP,1\n")
    assert last_backend_problems({"door-1": in_rotation(two)}, ["spark-1"], SERVES, "inv.py") == []


def test_the_rollout_refuses_before_touching_any_host(monkeypatch):
    touched = []

    class Door(NoAddress):
        doors = [("door-1", {})]

        def put_back_stale(self, log):
            return []

        def rotation(self):
            return {"door-1": in_rotation(STAT)}

        def drain(self, hosts, log, operation=None):
            touched.append(("drain", tuple(hosts)))

        def ready(self, hosts, log):
            touched.append(("ready", tuple(hosts)))

    monkeypatch.setattr(rollout_module.FrontDoorRuntime, "of", classmethod(lambda cls, inv: Door()))
    monkeypatch.setattr(rollout_module, "run_deploy", lambda *a, **k: touched.append(("deploy", a[1])) or {
        h: HostResult(h, changed=["unit"]) for h in a[1]})
    releases = {h: ("old", "new") for h in SERVES}
    with pytest.raises(Refused, match="draining spark-1 leaves its backend engines") as refused:
        rollout_module.rollout("inv.py", list(SERVES), releases, serves=SERVES, log=lambda m: None)
    assert touched == [] and refused.value.code == 1


def test_a_batch_whose_turn_finds_the_model_on_it_alone_halts_the_rollout(monkeypatch):
    """Found at a batch's turn (the others fell out while the rollout ran): it waits, then halts, draining nothing."""
    every = "# pxname,svname,qcur,qmax,scur,smax,status,weight\n" + "".join(
        f"engines,{h},0,0,0,1,UP,1\n" for h in SERVES)
    alone = every.replace("spark-1,0,0,0,1,UP", "spark-1,0,0,0,1,DOWN").replace("spark-3,0,0,0,1,UP",
                                                                                "spark-3,0,0,0,1,MAINT")
    answers = iter([every, every, alone])  # the start's check, batch 1's, batch 2's
    drained = []

    class Door(NoAddress):
        doors = [("door-1", {})]

        def put_back_stale(self, log):
            return []

        def rotation(self):
            return {"door-1": in_rotation(next(answers))}

        def drain(self, hosts, log, operation=None):
            drained.append(tuple(hosts))

        def ready(self, hosts, log):
            pass

    monkeypatch.setattr(rollout_module.FrontDoorRuntime, "of", classmethod(lambda cls, inv: Door()))
    monkeypatch.setattr(rollout_module, "BACK_IN_WAIT_S", 0)

    def run_deploy(inventory, hosts, data=None, deploy_file="deploy.py", before_ops=None):
        if before_ops:
            before_ops()
        return {h: HostResult(h, changed=["unit"]) for h in hosts}

    monkeypatch.setattr(rollout_module, "run_deploy", run_deploy)
    logged = []
    reports = rollout_module.rollout("inv.py", list(SERVES), {h: ("old", "new") for h in SERVES}, serves=SERVES,
                                     log=logged.append)
    assert drained == [("spark-1",)]
    assert [(r.host, r.result) for r in reports] == [("spark-1", "converged"), ("spark-2", "not reached"),
                                                    ("spark-3", "not reached")]
    assert reports[1].detail.startswith("halted: front door door-1: draining spark-2 leaves its backend engines")
    assert reports[1].detail in logged
