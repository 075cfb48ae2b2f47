"""A converged host's no-op converge, counted: the real stages (toolkit, service, guard, watchdog) run by pyinfra
against a host kept in memory (files, modes, owners, units), each fact read and each command being one SSH round
trip. The first converge of a bare host fills it; the second changes nothing and must stay within the budget."""

from __future__ import annotations

import hashlib
from datetime import datetime
import re
import shlex
from types import SimpleNamespace

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.deploy import add_deploy, deploy
from pyinfra.api.operations import run_ops
from pyinfra.connectors.base import BaseConnector
from pyinfra.connectors.util import CommandOutput, OutputLine

from sparkfleet.contract import paths
from sparkfleet.host.facts import JsonObject
from sparkfleet.host.run import ModelResult
from sparkfleet.release.image import ImagePin
from sparkfleet.release.plan import plan_hosts
from sparkfleet.tasks.guard import guard
from sparkfleet.tasks.service import service
from sparkfleet.tasks.watchdog import watchdog
from tests.unit.helpers import host_data

BUDGET = 5  # round trips of a no-op converge, per host: issue 24 asked <= 15; these stages send 3 (and this test fails on ac40cca)
ENGINE_REF = "vllm/vllm-openai@sha256:" + "b" * 64


class MemoryHost:
    """What a host holds, as far as these stages look: files (bytes, mode, owner), directories, units."""

    def __init__(self):
        self.files: dict[str, dict] = {}
        self.units: dict[str, dict] = {"docker.service": {"running": True, "enabled": True, "failed": False}}
        self.packages: dict[str, str] = {}
        self.round_trips: list[str] = []

    def entry(self, path: str) -> dict | None:
        return self.files.get(path)

    def put(self, path: str, data: bytes) -> None:
        old = self.files.get(path) or {"mode": 0o644, "user": "root", "group": "root"}
        self.files[path] = {**old, "type": "file", "data": data}

    def state(self) -> dict:
        files = {path: {"type": e["type"], "mode": e["mode"], "user": e["user"], "group": e["group"],
                        "sha256": hashlib.sha256(e["data"]).hexdigest() if e["type"] == "file" else None}
                 for path, e in self.files.items()}
        return {"files": files, "units": {name: dict(u) for name, u in self.units.items()},
                "packages": dict(self.packages)}

    def run(self, command: str) -> bool:
        """Apply the commands these stages send (each part of an `a && b` chain); others only count."""
        for part in command.split("&&"):
            self.apply(shlex.split(part.replace("(", " ").replace(")", " ")))
        return True

    def apply(self, words: list[str]) -> None:
        if not words:
            return
        if words[:2] == ["umask", "077"]:
            return
        if words[:2] == [":", ">"]:
            self.files[words[2]] = {"type": "file", "data": b"", "mode": 0o600, "user": "root", "group": "root"}
        elif words[0] == "touch":
            self.files.setdefault(words[-1], {"type": "file", "data": b"", "mode": 0o644, "user": "root",
                                              "group": "root"})
        elif words[:2] == ["mv", "-f"]:
            self.files[words[3]] = self.files.pop(words[2])
        elif words[:2] == ["mkdir", "-p"]:
            for path in words[2:]:
                self.files.setdefault(path, {"type": "dir", "mode": 0o755, "user": "root", "group": "root"})
        elif words[0] == "chmod":
            self.files[words[2]]["mode"] = int(words[1], 8)
        elif words[0] == "chown":
            user, _, group = words[1].partition(":")
            self.files[words[2]].update(user=user, group=group or self.files[words[2]]["group"])
        elif words[:2] == ["rm", "-f"] and len(words) == 3:
            self.files.pop(words[2], None)
        elif words[0] == "systemctl" and len(words) == 3:
            unit = self.units.setdefault(words[2], {"running": False, "enabled": False, "failed": False})
            unit.update({"start": {"running": True}, "restart": {"running": True}, "stop": {"running": False},
                         "enable": {"enabled": True}, "disable": {"enabled": False},
                         "reset-failed": {"failed": False}}.get(words[1], {}))
        elif "install" in words:
            self.packages.update({w: "1.0" for w in words[words.index("install") + 1:]})


def facts_of(spark: MemoryHost, plan) -> dict:
    """Converged answers to the facts these stages read, by fact class name (state facts from the host itself)."""
    def stat(path):
        e = spark.entry(path)
        return None if e is None or e["type"] != "file" else {"mode": int(f"{e['mode']:o}"), "user": e["user"],
                                                              "group": e["group"], "size": len(e["data"]),
                                                              "mtime": datetime.now()}

    def digest(name):
        def read(path):
            e = spark.entry(path)
            return None if e is None or e["type"] != "file" else getattr(hashlib, name)(e["data"]).hexdigest()
        return read

    def directory(path):
        e = spark.entry(path)
        return {"mode": int(f"{e['mode']:o}"), "user": e["user"], "group": e["group"]} if e and e["type"] == "dir" \
            else None

    def systemd(key):
        return lambda services=None, **_: {s: spark.units.get(s, {}).get(key, False) for s in services or []}

    return {
        "HostState": lambda: spark.state(), "PathState": lambda path: spark.state(),
        "UnitState": lambda unit: spark.state(),
        "TmpDir": lambda: "/tmp",
        "DockerImageState": lambda object_id: [{"Id": "sha256:" + "c" * 64, "RepoDigests": [object_id]}],
        "DebPackages": lambda: {name: [version] for name, version in spark.packages.items()},
        "Date": lambda: datetime.now(), "File": stat,
        "ServingProbe": lambda: {"serving": True, "gpu_visible": True, "starting": False},
        # main's per-file facts, so the same count runs there
        "Sha1File": digest("sha1"), "Sha256File": digest("sha256"), "Directory": directory,
        "SystemdStatus": systemd("running"), "SystemdEnabled": systemd("enabled"),
        "UnitFailed": lambda unit: False,
        "ServiceUnits": lambda: sorted(p.rsplit("/", 1)[1] for p in spark.files
                                       if re.fullmatch(r"/etc/systemd/system/sparkfleet-vllm-[a-z0-9-]+\.service", p)),
    }


class MemoryConnector(BaseConnector):
    handles_execution = True
    spark: MemoryHost

    @staticmethod
    def make_names_data(name):
        yield name, {}, []

    def connect(self):
        return None

    def run_shell_command(self, command, print_output=False, print_input=False, **arguments):
        text = command.get_raw_value() if hasattr(command, "get_raw_value") else str(command)
        self.spark.round_trips.append(text)
        return self.spark.run(text), CommandOutput([OutputLine("stdout", "")])

    def put_file(self, filename_or_io, remote_filename, remote_temp_filename=None, **arguments):
        data = filename_or_io.read() if hasattr(filename_or_io, "read") else open(filename_or_io, "rb").read()
        self.spark.round_trips.append(f"upload {remote_filename}")
        self.spark.put(remote_filename, data.encode() if isinstance(data, str) else data)
        return True

    def get_file(self, *args, **kwargs):
        raise NotImplementedError


def converge(spark: MemoryHost, plan) -> int:
    """One converge of the stages on `spark` as `pyinfra -y` runs it; returns its round trips."""
    before = len(spark.round_trips)
    inventory = Inventory(([("spark-a", {})], {}))
    state = State(inventory, Config())
    state.check_for_changes = False  # `pyinfra -y`
    host = inventory.get_host("spark-a")
    connector = type("Connector", (MemoryConnector,), {"spark": spark})
    host.connector = connector(state, host)
    answers = facts_of(spark, plan)

    def get_fact(cls, *args, **kwargs):
        spark.round_trips.append(f"fact {cls.__name__} {kwargs}")
        kwargs = {k: v for k, v in kwargs.items() if not k.startswith("_")}
        return answers[cls.__name__](*args, **kwargs)

    host.get_fact = get_fact

    @deploy("Stages")
    def stages():
        facts = SimpleNamespace(release=JsonObject(paths.RELEASE_FILE))
        model_result = ModelResult(runtime="/opt/sparkfleet/runtime/r1", fetched=SimpleNamespace(will_change=False),
                                   services_fetched={})
        service_result = service(plan, facts, model_result=model_result)
        guard(plan)
        watchdog(plan, model_result=model_result, service_result=service_result)

    connect_all(state)
    add_deploy(state, stages)
    run_ops(state)
    assert not state.failed_hosts, spark.round_trips[before:]
    spark.operations = sorted(name for op_hash in state.ops[host] for name in state.op_meta[op_hash].names)
    return len(spark.round_trips) - before


@pytest.fixture
def plan():
    pin = ImagePin(ENGINE_REF, ENGINE_REF.rpartition("@")[2], "registry")
    return plan_hosts([("spark-a", host_data())], resolve_image=lambda s: (pin, None))[0]


def test_a_converged_host_costs_a_handful_of_round_trips(plan):
    spark = MemoryHost()
    converge(spark, plan)
    first = spark.state()
    trips = converge(spark, plan)
    assert spark.state() == first  # nothing changed
    print(f"no-op converge of service, guard, watchdog: {trips} round trips")
    assert trips <= BUDGET, "\n".join(spark.round_trips[-trips:])
    # each operation costs the controller pyinfra's bookkeeping: only the serving check is asked of pyinfra
    assert spark.operations == ["Stages | Watchdog | Qwen3.5-35B-A3B is serving (else restarted and gated)"], spark.operations


def test_a_drifted_file_is_restored_by_its_own_operation(plan):
    spark = MemoryHost()
    converge(spark, plan)
    spark.files[paths.ENGINE_ENV]["mode"] = 0o644
    spark.put(paths.UNIT_PATH, b"[Unit]\nDescription=edited by hand\n")
    before = len(spark.round_trips)
    converge(spark, plan)
    sent = spark.round_trips[before:]
    assert f"chmod 0600 {paths.ENGINE_ENV}" in sent and f"upload {paths.UNIT_PATH}" in sent
    assert not [c for c in sent if c.startswith("upload") and c != f"upload {paths.UNIT_PATH}"]
    assert spark.files[paths.ENGINE_ENV]["mode"] == 0o600
    assert b"edited by hand" not in spark.files[paths.UNIT_PATH]["data"]
    assert f"systemctl restart {paths.UNIT_NAME}" in sent
