"""A role's desired state (roles/desired.py), planned without a host, and the one pass that ensures it
(tasks/ensure.py): the shape refuses a trigger that names nothing before it; each role's state keeps the order that
matters (a unit's file and what it reads before the unit, a wait after what it waits on, keys only in 0600 files);
the pass restarts, reloads, runs and waits only on what changed; and a fleet whose hosts hold different states,
run by pyinfra twice, orders its operations without a cycle and registers nothing the second time."""

from __future__ import annotations

import importlib
import json
from types import SimpleNamespace

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.deploy import deploy
from pyinfra.api.operations import run_ops
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_host, ctx_state
from pyinfra_cli.util import load_func

from sparkfleet.contract import monitoring as m
from sparkfleet.contract import paths
from sparkfleet.contract.settings import GROUPS_KEY
from sparkfleet.release.image import ImagePin
from sparkfleet.release.plan import plan_hosts
from sparkfleet.roles import chat_ui, pki
from sparkfleet.roles.desired import (Absent, Command, DesiredState, Directory, File, HttpWait, Packages, Unit,
                                      UnitRemoved, desired, secret)
from sparkfleet.roles.front_door.address import door_set
from sparkfleet.roles.front_door.desired import door_state
from sparkfleet.roles.front_door.holds import Hold
from sparkfleet.roles.front_door.plan import front_door_plan
from sparkfleet.roles.guard import guard_state
from sparkfleet.roles.monitoring import monitoring_state, node_metrics_state
from sparkfleet.tasks import ensure as ensure_module

from .helpers import KEY, host_data
from .test_noop_converge import MemoryConnector, MemoryHost, facts_of
from .test_pki import make_ca

ALICE, BOB = "alice-key-0123456789abcdef", "bob-key-0123456789abcdef"
NETWORKS = json.dumps([{"ifname": "eth0", "addr_info": [{"family": "inet", "local": "10.0.0.1", "prefixlen": 24}]}])
PIN = ImagePin("ghcr.io/open-webui/open-webui@sha256:" + "2" * 64, "sha256:" + "2" * 64, "registry")


# --- the shape -------------------------------------------------------------------------------------------------

def test_a_trigger_must_name_a_step_before_it_or_one_declared_after_another_stage():
    config = File("/etc/x.cfg", "Config", content="x\n")
    with pytest.raises(ValueError, match="/etc/x.cfg is the key of no step before it"):
        desired(Unit("x.service", "X", reload_on=("/etc/x.cfg",)), config)  # the reload before its file
    with pytest.raises(ValueError, match="/etc/tls/host.crt is the key of no step"):
        desired(config, Unit("x.service", "X", reload_on=("/etc/x.cfg", "/etc/tls/host.crt")))
    ok = desired(config, Unit("x.service", "X", reload_on=("/etc/x.cfg", "/etc/tls/host.crt")),
                 after=("/etc/tls/host.crt",))
    assert list(ok.units) == ["x.service"] and ok.after == ("/etc/tls/host.crt",)
    with pytest.raises(ValueError, match="two steps of one state"):
        desired(config, Absent("/etc/x.cfg", "X gone"))
    with pytest.raises(ValueError, match="a secret is content, 0600"):
        File("/etc/k", "K", content="k", secret=True)
    with pytest.raises(ValueError, match="either content or a source"):
        File("/etc/k", "K")


def test_desired_flattens_what_a_planner_leaves_out_and_joins_states():
    a = desired(Directory("/d", "D"), None, [File("/d/a", "A", content="a")])
    both = a + desired(Command("Check", "true", when=("/t",)), after=("/t",))
    assert [s.key for s in both.steps] == ["/d", "/d/a", "Check"] and both.after == ("/t",)
    assert desired(a, Command("Check", "true", when=("/d/a",))).commands["Check"].when == ("/d/a",)
    assert both.files["/d/a"].content == "a" and both.directories["/d"].mode == "0755"
    assert secret("/k", "K", "s").mode == "0600"


# --- each role's state -------------------------------------------------------------------------------------------

GROUPS = {"spark-a": ["sparks", "front_door", "monitoring"], "spark-b": ["sparks", "chat_ui"], "door-2": ["front_door"]}


def fleet(tmp_path, **extra):
    crt, key = make_ca(tmp_path)
    (tmp_path / "door.pem").write_text("-----BEGIN CERTIFICATE-----\nDOOR\n-----END CERTIFICATE-----\n")
    (tmp_path / "door.key").write_text("-----BEGIN PRIVATE KEY-----\nK\n-----END PRIVATE KEY-----\n")
    base = {"api_host": "0.0.0.0", "api_key": KEY, "front_door_users": {"alice": ALICE, "bob": BOB},
            "fleet_ca_cert": str(crt), "fleet_ca_key": str(key), "front_door_tls_cert": str(tmp_path / "door.pem"),
            "front_door_tls_key": str(tmp_path / "door.key"), "front_door_address": "10.0.0.100/24",
            "controller_front_door_ca": str(tmp_path / "door.pem"),
            "front_door_viewers": {"carol": "carol-password-0123"},
            "alertmanager_webhook_url": "http://alerts.lan:9000/hook", **extra}
    hosts = [(name, host_data(**base, lan_address=f"10.0.0.{n}", **{GROUPS_KEY: g}))
             for n, (name, g) in enumerate(GROUPS.items(), 1)]
    return {p.name: p for p in plan_hosts(hosts, resolve=False)}


def ordered(state: DesiredState) -> None:
    """What every role's state keeps: each unit after its file and after everything it restarts or reloads on, its
    file among what restarts it; each wait after the unit it waits on."""
    seen: list[str] = []
    for step in state.steps:
        if isinstance(step, Unit) and step.running and step.service.startswith("sparkfleet-"):
            unit_file = paths.unit_path(step.service)
            assert unit_file in seen and unit_file in step.restart_on and unit_file in step.daemon_reload_on, step
        assert set(getattr(step, "triggers", ())) <= set(seen) | set(state.after), step
        seen.append(step.key)


def test_the_doors_state_holds_its_keys_in_0600_files_and_reloads_on_every_map(tmp_path):
    plans = fleet(tmp_path)
    ui = chat_ui.chat_ui_plan(["spark-b"], plans)
    door = front_door_plan("spark-a", plans, True, door_set(["spark-a", "door-2"], plans), ui)
    gone = [Hold("spark-b", "rollout", "other-controller", 12, 0, 1)]
    state = door_state(door, NETWORKS, gone)
    ordered(state)
    unit = state.units[paths.FRONT_DOOR_UNIT_NAME]
    maps = {paths.FRONT_DOOR_CONFIG, paths.FRONT_DOOR_USERS_MAP, paths.FRONT_DOOR_BACKEND_MAP,
            paths.FRONT_DOOR_LIMITS_MAP, paths.FRONT_DOOR_USAGE_LUA, paths.FRONT_DOOR_CHAT_UI_USERS,
            paths.FRONT_DOOR_SECRETS, paths.FRONT_DOOR_LOGIN_PAGE, m.FRONT_DOOR_VIEWERS_MAP, paths.FRONT_DOOR_TLS_PEM}
    assert set(unit.reload_on) == maps | set(pki.TLS_FILES) | set(pki.PEERS_FILES) and state.after == pki.TLS_FILES
    for key in (ALICE, BOB, KEY):
        holders = {f.path for f in state.files.values() if f.content and key in f.content}
        assert holders and all(state.files[p].secret for p in holders), (key, holders)
    keepalived = state.files[paths.DOOR_ADDRESS_CONFIG]
    assert keepalived.mode == "0600" and keepalived.name == "Floating address 10.0.0.100/24 on eth0 (keepalived)"
    assert state.packages[paths.KEEPALIVED_PACKAGE].masked == (paths.KEEPALIVED_UNIT,)
    [wait] = state.waits.values()
    assert wait.url == "https://127.0.0.1:8080/health" and wait.insecure
    assert set(wait.when) == {paths.FRONT_DOOR_UNIT_NAME, paths.FRONT_DOOR_UNIT_PATH}
    [put_back] = state.commands.values()
    assert state.steps[-1] == put_back and put_back.when is None and "spark-b back in" in put_back.name
    assert not state.absent  # the chat UI's files are kept


def test_a_plain_door_without_address_ui_or_holds(tmp_path):
    plans = fleet(tmp_path, front_door_address=None, fleet_ca_cert=None, fleet_ca_key=None,
                  backend_key_in_clear=True, front_door_tls_cert=None, front_door_tls_key=None,
                  front_door_allow_http=True, front_door_viewers={})
    state = door_state(front_door_plan("door-2", plans))
    ordered(state)
    assert set(state.absent) == {paths.FRONT_DOOR_CHAT_UI_USERS, paths.FRONT_DOOR_SECRETS, paths.FRONT_DOOR_LOGIN_PAGE}
    off = state.units[paths.DOOR_ADDRESS_UNIT_NAME]
    assert (off.running, off.enabled) == (False, False) and paths.KEEPALIVED_PACKAGE not in state.packages
    assert not state.commands and state.after == () and not state.waits["Front door answers on port 8080"].insecure
    assert paths.FRONT_DOOR_TLS_PEM not in state.files and m.FRONT_DOOR_VIEWERS_MAP not in state.files


def test_the_guard_monitoring_node_metrics_chat_ui_and_tls_states_keep_their_order(tmp_path):
    plans = fleet(tmp_path)
    guard = guard_state(plans["spark-b"], runs_chat_ui=True)
    ordered(guard)
    assert set(guard.units[paths.GUARD_UNIT_NAME].reload_on) == {paths.GUARD_CONFIG, paths.GUARD_KEY_MAP,
                                                                  paths.GUARD_READY_LUA, *pki.TLS_FILES}
    assert guard.files[paths.GUARD_KEY_MAP].secret and KEY not in guard.files[paths.GUARD_CONFIG].content
    off = guard_state(plans["door-2"])  # a service host: HAProxy installed, no guard
    assert list(off.packages) == ["haproxy"] and off.units[paths.GUARD_UNIT_NAME].running is False

    mon = monitoring_state("spark-a", plans, {n: {"all", *g} for n, g in GROUPS.items()})
    ordered(mon)
    steps = [s.key for s in mon.steps]
    promtool = "Prometheus config and rules pass promtool"
    assert steps.index(m.PROMETHEUS_CONFIG) < steps.index(promtool) < steps.index(m.PROMETHEUS_UNIT_NAME)
    assert mon.files[m.PROMETHEUS_KEY].owner == (m.PROMETHEUS_USER, m.PROMETHEUS_USER)
    assert mon.files[m.PROMETHEUS_TLS_KEY].secret and mon.files[m.ALERTMANAGER_CONFIG].secret
    assert set(mon.units[m.PROMETHEUS_UNIT_NAME].reload_on) == {m.PROMETHEUS_RULES, m.PROMETHEUS_CONFIG,
                                                                 m.PROMETHEUS_KEY}

    ca = pki.ca_of(plans["spark-b"].settings)
    tls, cert = pki.tls_state(ca, "spark-b", "10.0.0.2", None)
    assert set(tls.files) == set(pki.TLS_FILES) and tls.files[paths.TLS_HOST_CERT].content == cert
    again, same = pki.tls_state(ca, "spark-b", "10.0.0.2", cert)  # the current one stands: nothing re-issued
    assert same == cert and paths.TLS_HOST_CERT not in again.files and tls.files[paths.TLS_HOST_KEY].secret
    metrics = node_metrics_state(cert)
    ordered(metrics)
    assert pki.EXPIRY_METRIC in metrics.files[paths.TLS_EXPIRY_TEXTFILE].content
    assert paths.TLS_EXPIRY_TEXTFILE not in node_metrics_state(None).files

    ui = chat_ui.chat_ui_plan(["spark-b"], plans)
    doors = [plans["spark-a"], plans["door-2"]]
    fresh = chat_ui.chat_ui_state(ui, doors, PIN, "m", None)
    ordered(fresh)
    assert not fresh.commands and fresh.files[paths.CHAT_UI_DOOR_CA].src == str(tmp_path / "door.pem")
    moved = chat_ui.chat_ui_state(ui, doors, PIN, "m", json.dumps({"digest": "sha256:" + "1" * 64}))
    keys = [s.key for s in moved.steps]
    [move] = moved.commands
    assert keys.index(paths.CHAT_UI_ENV) < keys.index(move) < keys.index(paths.CHAT_UI_UNIT_PATH)
    assert not chat_ui.chat_ui_state(ui, doors, PIN, "m", "not json").commands


# --- the pass ----------------------------------------------------------------------------------------------------

class Ops:
    """The operations tasks/ensure.py calls, recorded; `changing`: the names of those that change the host."""

    def __init__(self, changing=()):
        self.calls, self.changing = [], set(changing)

    def __getattr__(self, op):
        def call(*args, **kwargs):
            self.calls.append((op, kwargs))
            return SimpleNamespace(will_change=kwargs.get("name") in self.changing)
        return call


def run_ensure(monkeypatch, state, changing=(), earlier=None):
    ops = Ops(changing)
    for op in ("managed_file", "secret_file", "managed_directory", "managed_absent", "managed_unit",
               "managed_packages", "managed_permissions", "http_wait", "unit_removed"):
        monkeypatch.setattr(ensure_module, op, getattr(ops, op))
    monkeypatch.setattr(ensure_module, "server", SimpleNamespace(shell=ops.shell))
    with ctx_host.use(SimpleNamespace(name="h", loop=iter)):
        changed = ensure_module.ensure(state, earlier)
    return ops.calls, changed


SERVICE = desired(
    File("/etc/s.cfg", "Config", content="c"),
    secret("/etc/s.key", "Key", "k", owner=("svc", "svc")),
    File("/etc/systemd/system/s.service", "Unit file", content="u"),
    Unit("s.service", "Running", restart_on=("/etc/systemd/system/s.service",),
         reload_on=("/etc/s.cfg", "/etc/s.key", "/tls"), daemon_reload_on=("/etc/systemd/system/s.service",)),
    Command("Checked", "check /etc/s.cfg", when=("/etc/s.cfg",)),
    HttpWait("Answers", "http://127.0.0.1:1/", 5, 1, "no answer", when=("s.service", "/etc/systemd/system/s.service")),
    after=("/tls",))


def unit_call(calls):
    [(_, unit)] = [c for c in calls if c[0] == "managed_unit"]
    return unit["restarted"], unit["reloaded"], unit["daemon_reload"]


def test_a_changed_unit_file_restarts_and_waits_and_a_changed_config_reloads(monkeypatch):
    calls, changed = run_ensure(monkeypatch, SERVICE)
    assert unit_call(calls) == (False, False, False) and changed == dict.fromkeys(changed, False)
    assert [c[0] for c in calls] == ["managed_file", "secret_file", "managed_permissions", "managed_file",
                                     "managed_unit"]  # nothing to check, nothing to wait on

    calls, changed = run_ensure(monkeypatch, SERVICE, changing={"Unit file", "Running", "Answers"})
    assert unit_call(calls) == (True, False, True) and changed["Answers"]
    assert calls[-1] == ("http_wait", {"name": "Answers", "url": "http://127.0.0.1:1/", "timeout_s": 5,
                                       "max_time_s": 1, "failure": "no answer", "insecure": False})

    calls, _ = run_ensure(monkeypatch, SERVICE, changing={"Config"})
    assert unit_call(calls) == (False, True, False)
    assert ("shell", {"name": "Checked", "commands": ["check /etc/s.cfg"]}) in calls
    assert "http_wait" not in [c[0] for c in calls]


def test_another_stages_change_reloads_and_a_secret_is_given_to_its_user_after_it_lands(monkeypatch):
    calls, changed = run_ensure(monkeypatch, SERVICE, earlier={"/tls": True})
    assert unit_call(calls) == (False, True, False) and changed["/tls"]
    written, owned = calls[1], calls[2]
    assert written == ("secret_file", {"name": "Key", "dest": "/etc/s.key", "content": "k"})
    assert owned[1] | {"name": None} == {"name": None, "path": "/etc/s.key", "mode": "0600", "user": "svc",
                                         "group": "svc"}


def test_every_kind_of_step_reaches_its_operation(monkeypatch):
    state = desired(Packages("P", ("a", "b"), masked=("a.service",), extra_install_args="--x"),
                    Directory("/d", "D", mode="0750", owner=("root", "svc")), Absent("/old", "Gone"),
                    UnitRemoved("old.service", "/etc/systemd/system/old.service", "not wanted"),
                    Command("Always", "true"))
    calls, _ = run_ensure(monkeypatch, state)
    assert calls == [
        ("managed_packages", {"name": "P", "packages": ["a", "b"], "masked": ["a.service"],
                              "extra_install_args": "--x"}),
        ("managed_directory", {"name": "D", "path": "/d", "mode": "0750", "user": "root", "group": "svc"}),
        ("managed_absent", {"name": "Gone", "path": "/old"}),
        ("unit_removed", {}),
        ("shell", {"name": "Always", "commands": ["true"]})]


# --- pyinfra: a fleet of different states, twice ---------------------------------------------------------------

def run_fleet(memory: dict[str, MemoryHost], plans, groups, cli: bool, monkeypatch, stages) -> dict[str, list[str]]:
    """One run of the deploy `stages` over `plans`' hosts through pyinfra, loaded as a deploy file is (each host a
    MemoryHost; pyinfra's CLI mode orders operations by their call site, its API mode by their position); the
    operations registered per host."""
    import pyinfra

    monkeypatch.setattr(pyinfra, "is_cli", cli)
    names = list(plans)
    inventory = Inventory(([(n, {}) for n in names], {}),
                          **{g: ([n for n in names if g in groups[n]], {}) for g in ("front_door", "monitoring")})
    state = State(inventory, Config())
    state.check_for_changes = False
    for name in names:
        host = inventory.get_host(name)
        host.connector = type("Connector", (MemoryConnector,), {"spark": memory[name]})(state, host)
        answers = {**facts_of(memory[name], plans[name]), "JsonFile": lambda path: None}
        host.get_fact = lambda cls, *a, _answers=answers, **kw: _answers[cls.__name__](
            *a, **{k: v for k, v in kw.items() if not k.startswith("_")})

    connect_all(state)
    state.set_stage(StateStage.Prepare)
    with ctx_state.use(state):
        load_func(state, stages)  # as a deploy file is loaded: every host's greenlet at once
    state.get_op_order()  # raises on a cycle
    state.set_stage(StateStage.Execute)
    run_ops(state)
    assert not state.failed_hosts
    return {h.name: sorted(n for op in state.ops[h] for n in state.op_meta[op].names) for h in inventory}


def converge_fleet(memory, plans, groups, cli, monkeypatch) -> dict[str, list[str]]:
    """One converge of the guard, node metrics, front door and monitoring stages (run_fleet)."""
    from sparkfleet.tasks.front_door import front_door, no_front_door
    from sparkfleet.tasks.guard import guard
    from sparkfleet.tasks.monitoring import monitoring
    from sparkfleet.tasks.node_metrics import node_metrics

    stage = importlib.import_module("sparkfleet.tasks.front_door")
    monkeypatch.setattr(stage, "chat_ui_of", lambda state: (None, None))

    @deploy("Stages")
    def stages():
        from pyinfra import host

        plan = plans[host.name]
        guard(plan)
        if plan.runs_engine:
            node_metrics(plan)
        front_door(plan, plans) if "front_door" in groups[host.name] else no_front_door()
        if "monitoring" in groups[host.name]:
            monitoring(plan, plans, {n: {"all", *g} for n, g in groups.items()})

    return run_fleet(memory, plans, groups, cli, monkeypatch, stages)


@pytest.mark.parametrize("cli", [False, True], ids=["api", "cli"])
def test_hosts_of_different_states_converge_without_a_cycle_and_register_nothing_the_second_time(monkeypatch, cli):
    groups = {"spark-a": ["sparks", "front_door"], "door-1": ["front_door", "monitoring"], "spark-b": ["sparks"]}
    base = {"api_host": "0.0.0.0", "api_key": KEY, "front_door_users": {"alice": ALICE},
            "front_door_allow_http": True, "backend_key_in_clear": True}
    hosts = [(name, host_data(**base, lan_address=f"10.0.0.{n}", **{GROUPS_KEY: g}))
             for n, (name, g) in enumerate(groups.items(), 1)]
    plans = {p.name: p for p in plan_hosts(hosts, resolve=False)}
    memory = {name: MemoryHost() for name in plans}
    first = converge_fleet(memory, plans, groups, cli, monkeypatch)
    assert "Stages | Front door | Front door answers on port 8080" in first["door-1"]
    assert "Stages | Monitoring | Prometheus is ready" in first["door-1"]
    before = {name: host.state() for name, host in memory.items()}
    again = converge_fleet(memory, plans, groups, cli, monkeypatch)
    assert {name: host.state() for name, host in memory.items()} == before  # nothing changed
    assert again == {name: [] for name in plans}  # and nothing was even registered


@pytest.mark.parametrize("cli", [False, True], ids=["api", "cli"])
def test_hosts_whose_steps_interleave_differently_still_order_without_a_cycle(monkeypatch, cli):
    """Host a: file, file, unit, file; host b: file, unit, file. Numbered per call site alone, b's unit would come
    before its second file and a's after (a cycle, which pyinfra refuses); each step's position in the state keeps
    every host's operations in one order."""
    unit = paths.unit_path("x.service")
    states = {"spark-a": desired(File("/a1", "A1", content="1"), File("/a2", "A2", content="2"),
                                 File(unit, "X unit", content="u"),
                                 Unit("x.service", "X", restart_on=(unit,)), File("/a3", "A3", content="3")),
              "spark-b": desired(File(unit, "X unit", content="u"), Unit("x.service", "X", restart_on=(unit,)),
                                 File("/b2", "B2", content="2"))}
    plans = {name: SimpleNamespace(name=name) for name in states}

    @deploy("States")
    def stages():
        from pyinfra import host

        ensure_module.ensure(states[host.name])

    memory = {name: MemoryHost() for name in states}
    first = run_fleet(memory, plans, {n: [] for n in states}, cli, monkeypatch, stages)
    assert {"States | A3", "States | X"} <= set(first["spark-a"]) and "States | B2" in first["spark-b"]
    assert memory["spark-a"].files["/a3"]["data"] == b"3" and memory["spark-b"].units["x.service"]["running"]
