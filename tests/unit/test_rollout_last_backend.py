"""A rollout, an upgrade or a rollback never drains the last backend in rotation of a model out of the front door
(issues 35 and 49: one rule, in the batch loop the three share): a door still routing model M to spark-1 alone
(converged from an older inventory, or the others drained) while the inventory serves M on spark-2 and spark-3 too is
refused before any host is touched, naming the door, the host, the model and the fix; a model no other host serves
is drained as before (nothing could keep it)."""

from __future__ import annotations

from tests.unit.helpers import NoAddress

import pytest

from sparkfleet.fleet import batches as batches_module
from sparkfleet.fleet import rollout as rollout_module
from sparkfleet.fleet import upgrade as upgrade_module
from sparkfleet.fleet.batches import emptied_backends, last_backend_problems
from sparkfleet.fleet.converge import HostResult
from sparkfleet.fleet.front_door.runtime import in_rotation
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
    monkeypatch.setattr(batches_module, "BACK_IN_WAIT_S", 0)

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


class StaleDoor(NoAddress):
    """door-1 routing M to spark-1 alone (STAT): every drain, return and deploy recorded in `touched`."""

    doors = [("door-1", {})]

    def __init__(self, touched: list):
        self.touched = touched

    def put_back_stale(self, log):
        return []

    def rotation(self):
        return {"door-1": in_rotation(STAT)}

    def drain(self, hosts, log, operation=None):
        self.touched.append(("drain", tuple(hosts)))

    def ready(self, hosts, log):
        self.touched.append(("ready", tuple(hosts)))


def test_the_fix_names_the_command_it_belongs_to():
    for then in ("upgrade", "roll back"):
        [line] = last_backend_problems({"door-1": in_rotation(STAT)}, ["spark-1"], SERVES, "inv.py", then)
        assert line.startswith(f"front door door-1: draining spark-1 leaves its backend engines ({M}) with no server "
                               "in rotation, though spark-2, spark-3 serve")
        assert line.endswith(f"(pyinfra -y inv.py deploy.py --limit door-1), or bring them back in rotation, "
                             f"then {then}")


def test_an_upgrade_refuses_before_touching_any_host(monkeypatch):
    """The upgrade drains and reboots: its batch (spark-1, the only one with something to do) would leave M with no
    backend though spark-2 and spark-3 serve it: refused, exit 1, before any drain or step."""
    from sparkfleet.fleet.upgrade import HostSurvey

    touched = []
    monkeypatch.setattr(upgrade_module.FrontDoorRuntime, "of", classmethod(lambda cls, inv: StaleDoor(touched)))
    monkeypatch.setattr(upgrade_module, "run_deploy", lambda *a, **k: touched.append(("deploy", a[1])) or {})
    surveys = [HostSurvey("spark-1", ["curl 1 -> 2"], True), HostSurvey("spark-2"), HostSurvey("spark-3")]
    with pytest.raises(Refused) as refused:
        upgrade_module.upgrade("inv.py", surveys, serves=SERVES, log=lambda m: None)
    assert touched == [] and refused.value.code == 1
    assert str(refused.value) == last_backend_problems({"door-1": in_rotation(STAT)}, ["spark-1"], SERVES, "inv.py",
                                                       "upgrade")[0]
    assert "\n" not in str(refused.value)


def test_an_upgrade_whose_batches_keep_every_model_goes_on(monkeypatch):
    """The same door, spark-2 upgraded (it is in no chat backend in rotation): drained, stepped, converged, back."""
    from sparkfleet.fleet.upgrade import HostSurvey

    touched = []
    monkeypatch.setattr(upgrade_module.FrontDoorRuntime, "of", classmethod(lambda cls, inv: StaleDoor(touched)))

    def run_deploy(inventory, hosts, data=None, deploy_file="deploy.py", before_ops=None):
        if before_ops:
            before_ops()
        touched.append((deploy_file, tuple(hosts)))
        return {h: HostResult(h, changed=["Platform upgrade | x"]) for h in hosts}

    monkeypatch.setattr(upgrade_module, "run_deploy", run_deploy)
    surveys = [HostSurvey("spark-1"), HostSurvey("spark-2", ["curl 1 -> 2"]), HostSurvey("spark-3")]
    reports = upgrade_module.upgrade("inv.py", surveys, serves=SERVES, log=lambda m: None)
    assert touched == [("drain", ("spark-2",)), ("upgrade.py", ("spark-2",)), ("deploy.py", ("spark-2",)),
                       ("ready", ("spark-2",))]
    assert [r.result for r in reports] == ["unchanged", "upgraded", "unchanged"]


def test_a_rollback_refuses_before_touching_any_host(monkeypatch):
    touched = []
    monkeypatch.setattr(rollout_module.FrontDoorRuntime, "of", classmethod(lambda cls, inv: StaleDoor(touched)))
    monkeypatch.setattr(rollout_module, "run_deploy", lambda *a, **k: touched.append(("deploy", a[1])) or {})
    with pytest.raises(Refused) as refused:
        rollout_module.rollback("inv.py", ["spark-1"], {}, SERVES, log=lambda m: None)
    assert touched == [] and refused.value.code == 1
    assert str(refused.value).endswith("or bring them back in rotation, then roll back")
    assert str(refused.value).startswith("front door door-1: draining spark-1 leaves its backend engines")


def test_a_rollback_of_every_host_of_a_model_is_drained_as_before(monkeypatch):
    """Nothing outside the rollback serves M: nothing could keep it in, so the rollback goes on, in one batch, held
    by the rollback, and each host that came back is put back."""
    touched = []

    class Door(StaleDoor):
        def drain(self, hosts, log, operation=None):
            assert operation == "rollback"
            super().drain(hosts, log, operation)

    monkeypatch.setattr(rollout_module.FrontDoorRuntime, "of", classmethod(lambda cls, inv: Door(touched)))

    def run_deploy(inventory, hosts, data=None, deploy_file="deploy.py", before_ops=None):
        if before_ops:
            before_ops()
        touched.append((deploy_file, tuple(hosts)))
        return {h: HostResult(h, changed=["restored"], failed=["restore"] if h == "spark-3" else []) for h in hosts}

    monkeypatch.setattr(rollout_module, "run_deploy", run_deploy)
    reports = rollout_module.rollback("inv.py", list(SERVES), {}, SERVES, log=lambda m: None)
    assert touched == [("drain", tuple(SERVES)), ("rollback.py", tuple(SERVES)), ("ready", ("spark-1", "spark-2"))]
    assert [(r.host, r.result) for r in reports] == [("spark-1", "rolled back"), ("spark-2", "rolled back"),
                                                    ("spark-3", "failed")]


def test_a_rollback_knows_what_each_engine_host_serves_from_its_settings_alone():
    """No plan and no lock: each engine host's served name from its settings; a group's worker is no backend, and a
    host whose settings are refused is neither judged nor a peer."""
    from tests.unit.helpers import host_data

    pair = ["spark-1", "spark-2"]
    hosts = [("spark-1", host_data(tensor_parallel_hosts=pair)), ("spark-2", host_data(tensor_parallel_hosts=pair)),
             ("spark-3", host_data(served_model_name="other")), ("spark-4", {**host_data(), "max_model_len": -1})]
    served = rollout_module.served_names(hosts)
    assert served["spark-3"] == "other" and set(served) == {"spark-1", "spark-3"}
    assert served["spark-1"] == rollout_module.served_names([("spark-1", host_data())])["spark-1"]


def test_a_limited_change_counts_the_hosts_it_leaves_out_as_peers():
    """`--limit spark-1`: spark-2 and spark-3 are not planned, yet they keep M in rotation (their settings say they
    serve it); a selected host serves its model where its installed release serves the planned name too."""
    from types import SimpleNamespace

    def plan(name, runs_engine=True):
        return SimpleNamespace(name=name, runs_engine=runs_engine, settings=SimpleNamespace(served_model_name=M))

    installed = {"spark-1": {"served_model_name": M}, "spark-4": {"served_model_name": "x"},
                 "spark-5": {"served_model_name": M}}
    before = rollout_module.Before([plan("spark-1"), plan("spark-4"), plan("spark-5", runs_engine=False)], {}, [], {},
                                   installed=installed, peers={"spark-2": M, "spark-3": M})
    assert rollout_module.chat_models(before) == SERVES
