"""One run's shared state: the inventory planned once however many hosts pyinfra loads at the same time, and
the stages' results by name."""

from __future__ import annotations

import dataclasses

import gevent
import pytest
from pyinfra import host
from pyinfra.api import Config, Inventory, State

from sparkfleet.model.manifest import Manifest, ManifestFile
from sparkfleet.release.image import ImagePin
from tests.unit.helpers import host_data

HOSTS = 16
# pyinfra_cli (and sparkfleet.controller.inventory, which reads inventories with it) patches the stdlib for gevent when
# imported: the tests import it when they run, as test_image.py does, not when pytest collects this file.


def moving_hub(calls: list):
    """A hub whose `main` moves on every question, answering after a yield (a client waiting on its socket)."""
    def resolve(s):
        calls.append(s.model_repo)
        commit = f"{len(calls):040x}"
        gevent.sleep(0)
        return Manifest("modelscope", s.model_repo, s.model_revision, commit,
                        (ManifestFile("model.safetensors", 1000, sha256="a" * 64),)), None, None
    return resolve


def moving_tag(calls: list):
    def resolve(s):
        calls.append(s.engine_image)
        digest = f"sha256:{len(calls):064x}"
        gevent.sleep(0)
        return ImagePin(f"vllm/vllm-openai@{digest}", digest, "registry"), None
    return resolve


def fleet_state(count: int) -> State:
    inventory = Inventory(([(f"spark-{i}", host_data(ssh_hostname=f"10.0.0.{i + 1}")) for i in range(count)], {}))
    state = State(inventory, Config())
    for h in inventory:
        state.active_hosts.add(h)
    return state


def test_hosts_loaded_at_once_share_one_hub_resolve_and_one_release(monkeypatch):
    from pyinfra_cli.util import _parallel_load_hosts

    from sparkfleet.controller import inventory as inventory_mod

    hub_calls, image_calls = [], []
    monkeypatch.setattr(inventory_mod, "hub_resolver", moving_hub(hub_calls))
    monkeypatch.setattr(inventory_mod, "image_resolver", moving_tag(image_calls))
    state = fleet_state(HOSTS)
    plans = {}
    # pyinfra's own loader: one greenlet per host runs the deploy code, as `pyinfra inventory deploy.py` does
    _parallel_load_hosts(state, lambda: plans.setdefault(host.name, inventory_mod.plan_for(state, host)), "deploy")
    assert sorted(plans) == sorted(h.name for h in state.inventory)
    assert len(hub_calls) == 1 and len(image_calls) == 1
    assert len({p.release_id for p in plans.values()}) == 1
    assert all(plans[name] is p for name, p in inventory_mod.plans(state).items())


def test_a_run_is_made_once_per_pyinfra_state_and_through_its_context():
    from pyinfra import state as current
    from pyinfra.context import ctx_state

    from sparkfleet.host.run import run_of

    first, second = State(), State()
    with ctx_state.use(first):
        assert run_of(current) is run_of(first)
    assert run_of(first) is run_of(first) and run_of(second) is not run_of(first)


def test_once_computes_once_and_hands_a_failure_to_every_caller():
    from sparkfleet.host.run import Run

    run, calls = Run(), []

    def refuse():
        calls.append(1)
        gevent.sleep(0)
        raise ValueError("no")

    def ask():
        with pytest.raises(ValueError):
            run.once("plans", "inventory", refuse)

    gevent.joinall([gevent.spawn(ask) for _ in range(4)], raise_error=True)
    assert calls == [1]


def test_stage_results_are_frozen_and_named():
    from sparkfleet.host.run import ModelResult

    result = ModelResult(runtime="/opt/rt", fetched=None, services_fetched={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.runtime = "/elsewhere"
    with pytest.raises(TypeError):
        runtime, fetched = result  # a result is not a tuple: unpacking it fails loudly, not by position


STAGES = ("preflight", "platform", "container_toolkit", "model", "service", "guard", "health", "watchdog", "front_door",
          "no_front_door", "node_metrics", "monitoring", "service_preflight", "chat_ui", "no_chat_ui", "backup_source",
          "no_backup", "backup_target", "no_backup_target")


@pytest.fixture
def stand_ins(monkeypatch):
    """`converge`'s stages and helpers replaced by stand-ins that bind each call to the real stage's signature and
    answer the real result types: a stage called with a stale shape fails. Yields (calls, plan, results)."""
    import inspect
    from types import SimpleNamespace

    from pyinfra.operations import files

    import sparkfleet.tasks as tasks
    from sparkfleet.controller.backup_plan import BackupPlan
    from sparkfleet.host.run import ModelResult, ServiceResult

    plan, facts = SimpleNamespace(name="spark-1", role="single"), SimpleNamespace(arch="aarch64")
    results = {"preflight": facts, "model": ModelResult(runtime="/opt/rt", fetched=None, services_fetched={}),
               "service": ServiceResult(started=None, keep=[], services_started={})}
    calls, monitored = {}, {}

    def stand_in(stage):
        signature = inspect.signature(stage)

        def call(*args, **kwargs):
            calls[stage.__name__] = signature.bind(*args, **kwargs).arguments
            return results.get(stage.__name__)
        return call

    for name in STAGES:
        monkeypatch.setattr(tasks, name, stand_in(getattr(tasks, name)))
    monkeypatch.setattr(tasks, "plan_for", lambda state, host: plan)
    monkeypatch.setattr(tasks, "plans", lambda state: {"spark-1": plan})
    monkeypatch.setattr(tasks, "prepare", lambda plan, facts: "prepared")
    monkeypatch.setattr(tasks, "chat_ui_of", lambda state: (None, None))  # an inventory without a group chat_ui
    monkeypatch.setattr(tasks, "backup_of", lambda state: BackupPlan())  # an inventory without backups
    monkeypatch.setattr(tasks, "monitored_groups", lambda state: dict(monitored))
    monkeypatch.setattr(tasks, "fleet_point", lambda **kwargs: None)  # an operation: it needs a pyinfra state
    monkeypatch.setattr(files, "directory", lambda **kwargs: calls.setdefault("own operation", kwargs))
    return calls, plan, results, monitored


@pytest.mark.parametrize("groups", [["front_door"], ["sparks"], ["front_door", "monitoring"]])
@pytest.mark.parametrize("deploy_file", ["deploy.py", "sparkfleet/deploys/deploy.py", "examples/my_deploy.py"])
def test_deploy_files_hand_each_stage_what_its_signature_names(deploy_file, groups, stand_ins):
    """The checkout's deploy, the packaged one and the foreign example all run `converge`'s whole sequence."""
    import runpy
    from types import SimpleNamespace

    from pyinfra.context import ctx_host

    from tests.unit.helpers import ROOT

    calls, plan, results, monitored = stand_ins
    if "monitoring" in groups:
        monitored["spark-1"] = set(groups)
    with ctx_host.use(SimpleNamespace(name="spark-1", groups=groups)):
        runpy.run_path(str(ROOT / deploy_file))

    assert calls["preflight"] == {"plan": plan}
    assert calls["platform"] == {"plan": plan}
    assert calls["container_toolkit"] == {"plan": plan, "arch": "aarch64"}
    assert calls["guard"] == {"plan": plan}  # one guard, monitored or not
    assert calls["model"] == {"plan": plan, "facts": results["preflight"], "prepared": "prepared"}
    assert calls["service"]["model_result"] is results["model"]
    for stage in ("health", "watchdog"):
        assert calls[stage] == {"plan": plan, "model_result": results["model"], "service_result": results["service"]}
    assert ("front_door" in calls) == ("front_door" in groups) != ("no_front_door" in calls)  # a door, or none left
    assert "no_chat_ui" in calls and "chat_ui" not in calls  # no chat UI, and none left running
    assert calls["no_backup"] == calls["no_backup_target"] == {}  # no backups, and no timer or jail left
    assert "backup_source" not in calls and "backup_target" not in calls
    if "front_door" in calls:
        assert calls["front_door"] == {"plan": plan, "plans": {"spark-1": plan}}
    assert ("own operation" in calls) == (deploy_file == "examples/my_deploy.py")
    assert ("node_metrics" in calls) == ("monitoring" in calls) == ("monitoring" in groups)
    if "monitoring" in calls:
        assert calls["node_metrics"] == {"plan": plan}
        assert calls["monitoring"] == {"plan": plan, "plans": {"spark-1": plan}, "groups": {"spark-1": set(groups)}}


def test_converge_takes_a_given_plan_and_stops_after_a_failed_preflight(stand_ins, monkeypatch):
    from types import SimpleNamespace

    from pyinfra.context import ctx_host

    import sparkfleet.tasks as tasks

    calls, _, results, _ = stand_ins
    given = SimpleNamespace(name="spark-1", role="single", given=True)
    monkeypatch.setattr(tasks, "plan_for", lambda state, host: pytest.fail("a given plan is not planned again"))
    results["preflight"] = None  # the host is not fit: nothing after preflight runs
    with ctx_host.use(SimpleNamespace(name="spark-1", groups=["front_door"])):
        tasks.converge(given)
    assert calls == {"preflight": {"plan": given}}
