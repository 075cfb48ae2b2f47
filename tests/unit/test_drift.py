"""only_on_drift: an operation is registered with pyinfra only where its own generator, on the batched read, would
yield a command; elsewhere the caller gets UNCHANGED, pyinfra's own OperationMeta of an operation that ran no
command (every public answer compared with a registered operation's). A drifted host (and every operation after
its first change), a conditional call and a reading that raises all get the real operation. The probe is pyinfra's
own question asked early: every operation it wraps answers it as pyinfra's registration does, with the same first
command, and changes nothing the controller holds while asked (no held read forgotten, no run state touched)."""

from __future__ import annotations

import copy
import importlib
import pkgutil

import pytest
from pyinfra.api import Config, Inventory, OperationError, State
from pyinfra.api.connect import connect_all
from pyinfra.api.operation import OperationMeta
from pyinfra.api.operations import run_ops
from pyinfra.connectors.base import BaseConnector
from pyinfra.context import ctx_host, ctx_state
from pyinfra_testing.util import FakeState, create_host

import sparkfleet.host
from sparkfleet.contract import paths
from sparkfleet.host import managed, model_files, operations, serving, services, toolkit
from sparkfleet.host.drift import UNCHANGED, only_on_drift, would_change
from sparkfleet.host.managed import managed_file, managed_unit
from sparkfleet.host.operations import secret_file
from sparkfleet.host.run import run_of
from sparkfleet.host.state import snapshot
from sparkfleet.model.manifest import Manifest, ManifestFile


def recorded(yields):
    """A stand-in operation: its calls are recorded, its generator yields `yields` (or raises)."""
    calls = []

    def op(*args, **kwargs):
        calls.append(kwargs)
        return "registered"

    def inner(dest, content="", name=None):
        assert name is None, "the name is pyinfra's, never the generator's"
        if yields == "raise":
            raise OperationError(f"{dest} is a directory")
        yield from yields

    op._inner = inner
    return only_on_drift(op), calls


@pytest.fixture
def a_host():
    """A host in pyinfra's context, its batched read empty."""
    state, host = on_host({})
    with state, host:
        yield


def test_an_operation_with_nothing_to_do_is_not_registered(a_host):
    op, calls = recorded([])
    assert op(name="A file", dest="/etc/x") is UNCHANGED and calls == []


def test_an_operation_that_would_change_something_is_registered_once_with_its_name(a_host):
    op, calls = recorded(["echo changed"])
    assert op(name="A file", dest="/etc/x") == "registered"
    assert calls == [{"name": "A file", "dest": "/etc/x"}]


def test_after_a_change_every_later_operation_on_the_host_is_registered(a_host):
    """The batched read is the host before this run: once an operation will change it (a package installed starts
    a unit; a secret rewritten as root loses its owner), pyinfra asks the later ones again when they run."""
    change, _ = recorded(["apt-get install haproxy"])
    later, calls = recorded([])
    change(name="A package", dest="/usr/sbin/haproxy")
    assert later(name="Its unit off", dest="/etc/x") == "registered" and len(calls) == 1


@pytest.mark.parametrize("argument", ["_if", "_sudo", "_ignore_errors"])
def test_an_operation_with_any_pyinfra_argument_is_registered_as_before(a_host, argument):
    op, calls = recorded([])
    assert op(name="A file", dest="/etc/x", **{argument: True}) == "registered" and len(calls) == 1


def test_a_reading_that_raises_is_left_to_pyinfra_which_reports_it_for_that_host(a_host):
    op, calls = recorded("raise")
    assert op(name="A file", dest="/etc/x") == "registered" and len(calls) == 1


def test_unchanged_answers_like_the_meta_of_an_operation_that_changed_nothing():
    assert UNCHANGED.will_change is False and UNCHANGED.executed is False
    assert UNCHANGED.did_change() is False and UNCHANGED.did_not_change() is True
    assert UNCHANGED.did_succeed() is True and UNCHANGED.is_complete() is True


SHA_OF_HELLO = "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"  # sha256 of b"hello\n"
FILE = {"type": "file", "mode": 0o644, "user": "root", "group": "root", "sha256": SHA_OF_HELLO}


def on_host(files: dict, units: dict | None = None):
    """A host whose batched read (sparkfleet/host/state.py) holds these files and units."""
    host = create_host(FakeState(), facts={"state.HostState": {"files": files, "units": units or {}}})
    host.name = "spark-1"
    return ctx_state.use(host.state), ctx_host.use(host)


def converged():
    return on_host({paths.SERVING_FILE: FILE, paths.ENGINE_ENV: dict(FILE, mode=0o600)},
                   {paths.UNIT_NAME: {"running": True, "enabled": True, "failed": False}})


def test_sparkfleets_own_operations_decide_before_pyinfra_is_asked():
    """A current file, a running unit, a current secret: none is registered (FakeState has no operations)."""
    state, host = converged()
    with state, host:
        assert managed_file(name="A file", dest=paths.SERVING_FILE, content="hello\n") is UNCHANGED
        assert managed_unit(name="The engine", service=paths.UNIT_NAME, running=True, enabled=True) is UNCHANGED
        assert secret_file(name="A secret", dest=paths.ENGINE_ENV, content="hello\n") is UNCHANGED


@pytest.mark.parametrize("call", [
    lambda: (managed_file, {"name": "A file", "dest": paths.SERVING_FILE, "content": "edited by hand\n"}),
    lambda: (managed_file, {"name": "A file", "dest": paths.SERVING_FILE, "content": "hello\n", "mode": "0600"}),
    lambda: (managed_unit, {"name": "The engine", "service": paths.UNIT_NAME, "running": True, "restarted": True}),
    lambda: (managed_unit, {"name": "The engine", "service": paths.UNIT_NAME, "enabled": False}),
    lambda: (secret_file, {"name": "A secret", "dest": paths.ENGINE_ENV, "content": "rotated\n"}),
])
def test_a_drift_or_an_asked_restart_still_gets_its_operation(call):
    op, kwargs = call()
    state, host = converged()
    with state, host:
        assert would_change(op, (), kwargs)


# --- the stand-in pinned to pyinfra's OperationMeta -------------------------------------------------------------

class Nowhere(BaseConnector):
    """A host no command reaches: what these tests run sends none."""

    handles_execution = True

    @staticmethod
    def make_names_data(name):
        yield name, {}, []

    def connect(self):
        return None

    def run_shell_command(self, command, *args, **kwargs):
        raise AssertionError(f"a command was sent: {command}")

    def put_file(self, *args, **kwargs):
        raise AssertionError("a file was sent")

    def get_file(self, *args, **kwargs):
        raise AssertionError("a file was fetched")


def real_host(facts: dict, check_for_changes: bool = True):
    """pyinfra's own State and Host, operations registered as in a run; each fact answered from `facts` by its
    class name (a value, or a function of the fact's arguments), a fresh copy each time (a held answer that
    changes was changed by its holder)."""
    inventory = Inventory(([("spark-1", {})], {}))
    state = State(inventory, Config())
    state.check_for_changes = check_for_changes
    host = inventory.get_host("spark-1")
    host.connector = Nowhere(state, host)

    def get_fact(cls, *args, **kwargs):
        answer = facts[cls.__name__]
        kwargs = {k: v for k, v in kwargs.items() if not k.startswith("_")}
        return copy.deepcopy(answer(*args, **kwargs) if callable(answer) else answer)

    host.get_fact = get_fact
    return state, host


def the_pyinfra_operation(op):
    """The operation pyinfra's @operation made, under sparkfleet's wrappers (only_on_drift, named)."""
    while getattr(op, "__wrapped__", None) is not op._inner:
        op = op.__wrapped__
    return op


MUTATORS = {"set_complete"}  # pyinfra's own: called by pyinfra when the operation ran, never by a stage


def answers(meta: OperationMeta) -> dict:
    """Every public answer of an OperationMeta (properties read, methods called without arguments). A public name
    pyinfra adds that cannot be answered so fails here: look at what UNCHANGED should say to it."""
    found = {}
    for name in sorted(n for n in dir(OperationMeta) if not n.startswith("_") and n not in MUTATORS):
        value = getattr(meta, name)
        found[name] = value() if callable(value) else value
    return found


@pytest.mark.parametrize("check_for_changes", [True, False], ids=["pyinfra", "pyinfra -y"])
def test_unchanged_answers_every_public_question_as_an_operation_that_ran_and_changed_nothing(check_for_changes):
    """The stand-in against pyinfra's interface: a current file's managed_file registered with pyinfra and run,
    its meta asked everything OperationMeta answers publicly; UNCHANGED must answer each the same. A pyinfra
    that adds, drops or changes an answer fails here, not in a stage."""
    state, host = real_host(CURRENT, check_for_changes)
    with ctx_state.use(state), ctx_host.use(host):
        meta = the_pyinfra_operation(managed_file)(name="A file", dest=paths.SERVING_FILE, content="hello\n")
    connect_all(state)
    run_ops(state)
    assert isinstance(UNCHANGED, OperationMeta)
    with ctx_state.use(state), ctx_host.use(host):
        ran = answers(meta)
        assert ran["is_complete"] is True and ran["did_change"] is False and ran["did_succeed"] is True
        assert answers(UNCHANGED) == ran
    assert {"will_change", "did_change", "did_not_change", "did_succeed", "is_complete", "executed",
            "changed"} <= set(ran)  # what the stages and fleet/converge.py ask


# --- the probe: pyinfra's question, asked early, with no side effect ------------------------------------------

SHA_OF_EDITED = "0" * 64
UNIT_FILE = f"{paths.SYSTEMD_DIR}/sparkfleet-vllm-embed.service"


def state_of(files=None, units=None, packages=None, users=None) -> dict:
    return {"files": files or {}, "units": units or {}, "packages": packages or {}, "users": users or {}}


def on_a_host(batched: dict, **more):
    """Fact answers: the batched read, any path or unit outside it absent, a temp dir, and `more`."""
    return {"HostState": batched, "PathState": lambda path: state_of(), "UnitState": lambda unit: state_of(),
            "TmpDir": "/tmp", **more}


CURRENT = on_a_host(state_of({paths.SERVING_FILE: FILE, paths.ENGINE_ENV: dict(FILE, mode=0o600)},
                             {paths.UNIT_NAME: {"running": True, "enabled": True, "failed": False}}))
STOPPED = {"running": False, "enabled": False, "failed": False}
MANIFEST = Manifest("huggingface", "Qwen/Qwen3-0.6B", "main", "a" * 40,
                    (ManifestFile("config.json", 120, blob_sha1="1" * 40),))


def drifting(tmp_path):
    """One call per operation only_on_drift wraps, on a host it would change: the probe runs the operation's
    generator to its first command, past every read and decision it makes before it."""
    template = tmp_path / "unit.j2"
    template.write_text("[Unit]\nDescription={{ what }}\n")
    edited = on_a_host(state_of({paths.SERVING_FILE: dict(FILE, sha256=SHA_OF_EDITED),
                                 paths.ENGINE_ENV: dict(FILE, mode=0o644),
                                 UNIT_FILE: FILE},
                                {paths.UNIT_NAME: STOPPED, "haproxy.service": dict(STOPPED, failed=True)}),
                       KeyringKeys={}, DockerImageState=[], JsonFile=lambda path: None,
                       ModelDirs=lambda model_root: [f"{model_root}/Qwen--Qwen3-0.6B@aaaa"], FileContents=None,
                       DockerServerVersion=(24, 0), DebPackages={}, DebArch="arm64",
                       AptSources=[], File=None, Directory=None, Link=None)
    return {
        "managed_file": (managed.managed_file, {"dest": paths.SERVING_FILE, "content": "hello\n"}),
        "managed_files": (managed.managed_files, {"files": [(__file__, paths.SERVING_FILE, "0644")]}),
        "managed_template": (managed.managed_template, {"src": str(template), "dest": paths.SERVING_FILE,
                                                       "what": "x"}),
        "managed_directory": (managed.managed_directory, {"path": paths.CONFIG_DIR}),
        "managed_permissions": (managed.managed_permissions, {"path": paths.ENGINE_ENV, "mode": "0600"}),
        "managed_absent": (managed.managed_absent, {"path": UNIT_FILE}),
        "managed_unit": (managed.managed_unit, {"service": paths.UNIT_NAME, "running": True}),
        "managed_packages": (managed.managed_packages, {"packages": ["haproxy"], "masked": ["haproxy.service"]}),
        "managed_user": (managed.managed_user, {"user": paths.SHARE_USER, "home": "/nonexistent",
                                                "shell": "/usr/sbin/nologin"}),
        "apt_keyring": (operations.apt_keyring, {"src": "https://example.invalid/key.gpg",
                                                 "dest": paths.TOOLKIT_KEYRING, "fingerprint": "A" * 40}),
        "image_pinned": (operations.image_pinned, {"image": "vllm/vllm-openai:v1", "ref": "vllm/vllm-openai@sha256:"
                                                   + "b" * 64, "digest": "sha256:" + "b" * 64}),
        "old_models_removed": (operations.old_models_removed, {"model_root": "/var/lib/sparkfleet/models",
                                                               "keep": []}),
        "secret_file": (operations.secret_file, {"name": "A secret", "dest": paths.ENGINE_ENV,
                                                 "content": "rotated\n"}),
        "release_kept_for_rollback": (operations.release_kept_for_rollback, {"installed_release": "a" * 12,
                                                                             "new_release": "b" * 12}),
        "toolkit_at_least": (toolkit.toolkit_at_least, {"minimum": "1.17.0"}),
        "cdi_spec_current": (toolkit.cdi_spec_current, {"driver": "580.95.05"}),
        "docker_nvidia_runtime": (toolkit.docker_nvidia_runtime, {}),
        "docker_takes_cdi_devices": (toolkit.docker_takes_cdi_devices, {}),
        "container_sees_gpu": (toolkit.container_sees_gpu, {"image": "vllm/vllm-openai:v1", "gpu_options": (),
                                                            "pull": True}),
        "runtime_bundle": (model_files.runtime_bundle, {"tarball": "/cache/runtime-1.tar.gz", "sha256": "c" * 64}),
        "model_verified": (model_files.model_verified, {"manifest": MANIFEST, "model_dir": "/m/Qwen--x@aaaa",
                                                       "endpoint": None, "runtime": "/r",
                                                       "model_files": {"record": {}, "files": {}}}),
        "services_pruned": (services.services_pruned, {"keep": []}),
        "start_limit_cleared": (serving.start_limit_cleared, {"unit": "haproxy.service"}),
    }, edited


def current():
    """Calls on a host where they change nothing (the probe and pyinfra both find no command)."""
    return {
        "managed_file": (managed.managed_file, {"dest": paths.SERVING_FILE, "content": "hello\n"}),
        "managed_unit": (managed.managed_unit, {"service": paths.UNIT_NAME, "running": True, "enabled": True}),
        "managed_permissions": (managed.managed_permissions, {"path": paths.ENGINE_ENV, "mode": "0600",
                                                              "user": "root"}),
        "secret_file": (operations.secret_file, {"name": "A secret", "dest": paths.ENGINE_ENV, "content": "hello\n"}),
        "managed_absent": (managed.managed_absent, {"path": UNIT_FILE}),
    }, CURRENT


def wrapped_operations() -> set[str]:
    """Every operation under sparkfleet/host/ that only_on_drift wraps, by name."""
    found = set()
    for module in pkgutil.iter_modules(sparkfleet.host.__path__):
        for name, value in vars(importlib.import_module(f"sparkfleet.host.{module.name}")).items():
            if getattr(value, "only_on_drift", False):
                found.add(name)
    return found


def test_every_operation_only_on_drift_wraps_is_probed_here(tmp_path):
    """A new operation under only_on_drift gets its drifting call below, and with it the tests that hold it to
    no side effect and to pyinfra's answer."""
    calls, _ = drifting(tmp_path)
    assert wrapped_operations() == set(calls)


def text(command) -> str | None:
    """A command as pyinfra would send it (an upload: its kind), None for no command."""
    if command is None or isinstance(command, str):
        return command
    return command.get_raw_value() if hasattr(command, "get_raw_value") else type(command).__name__


def first_command(op, kwargs):
    """The probe's first command: the operation's own generator, as only_on_drift asks it."""
    generator = op._inner(**{k: v for k, v in kwargs.items() if k != "name"})
    try:
        return text(next(generator, None))
    finally:
        generator.close()


def pyinfras_first_command(state, host):
    """The first command of the one operation registered for host, from pyinfra's own generator."""
    (data,) = state.ops[host].values()
    generator = data.command_generator()
    try:
        return text(next(generator, None))
    finally:
        generator.close()


@pytest.mark.parametrize("name,drifts", [
    *(pytest.param(n, True, id=f"{n}-drifting") for n in sorted(wrapped_operations())),
    *(pytest.param(n, False, id=f"{n}-current") for n in sorted(current()[0])),
])
def test_the_probe_asks_pyinfras_own_question_and_gets_its_answer(tmp_path, name, drifts):
    """would_change against the operation registered with pyinfra (its check for changes, will_change): the same
    answer and the same first command, so no operation answers the probe otherwise than pyinfra."""
    calls, facts = drifting(tmp_path) if drifts else current()
    op, kwargs = calls[name]
    state, host = real_host(facts)
    with ctx_state.use(state), ctx_host.use(host):
        probed, first = would_change(op, (), kwargs), first_command(op, kwargs)
    state, host = real_host(facts)
    with ctx_state.use(state), ctx_host.use(host):
        registered = the_pyinfra_operation(op)(**{"name": f"A {name}", **kwargs})
        assert probed is drifts and registered.will_change is drifts
        assert first == pyinfras_first_command(state, host) and (first is not None) is drifts


def controller_holds(state, host) -> dict:
    """What the controller holds of a host in a run: its held reads, the run's state, pyinfra's operation context."""
    run = run_of(state)
    return copy.deepcopy({
        "reads": dict(getattr(host, "_sparkfleet_facts", {})),
        "run": {"drifted": set(run.drifted), "gates": dict(run.health_gates), "settled": set(run.settled)},
        "context": {"in_op": host.in_op, "op": host.current_op_hash, "arguments": host.current_op_global_arguments},
        "operations": dict(state.ops.get(host, {})),
    })


@pytest.mark.parametrize("name", sorted(wrapped_operations()))
def test_a_probe_changes_nothing_the_controller_holds(tmp_path, name):
    """Asked whether it would change the host (only_on_drift's probe, pyinfra's check for changes), an operation
    reads and decides: no held read is forgotten or altered (a later operation's read costs no round trip), the
    run and pyinfra's operation context are as they were, nothing is registered. Asked twice, it answers the
    same from what the first asking read."""
    calls, facts = drifting(tmp_path)
    op, kwargs = calls[name]
    state, host = real_host(facts)
    with ctx_state.use(state), ctx_host.use(host):
        snapshot(host)  # the batched read, held as preflight's round trip leaves it
        before = controller_holds(state, host)
        assert would_change(op, (), kwargs) is True
        after = controller_holds(state, host)
        assert {key: after["reads"][key] for key in before["reads"]} == before["reads"]
        assert {key: value for key, value in after.items() if key != "reads"} == {
            key: value for key, value in before.items() if key != "reads"}
        assert would_change(op, (), kwargs) is True
        assert controller_holds(state, host) == after
