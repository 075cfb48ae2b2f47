"""Every custom operation against fake facts (pyinfra-testing's runner), and the
model operation in Python: converged facts must produce no commands."""

import json
import re
import shlex
from pathlib import Path

import pytest
from pyinfra.api import OperationError, OperationValueError
from pyinfra.api.operation import OperationMeta
from pyinfra.connectors.util import CommandOutput
from pyinfra.context import ctx_host, ctx_state
from pyinfra_testing.operations import make_operation_tests
from pyinfra_testing.util import FakeState, create_host

from sparkfleet.contract.formats import DEFAULT_KEY_VAR as API_KEY_VAR
from sparkfleet.host.facts import DockerImageState, Unreadable
from sparkfleet.host.model_files import model_verified
from sparkfleet.host.operations import (
    env_command,
    health_gate_results,
    image_pinned,
    old_models_removed,
    previous_release_restored,
    record_health_gate,
    release_kept_for_rollback,
    rollback_problem,
    secret_file,
)
from sparkfleet.host.toolkit import docker_nvidia_runtime
from sparkfleet.model.manifest import Manifest, ManifestFile

CASES = Path(__file__).parent / "operations"

TestDockerNvidiaRuntime = make_operation_tests("sparkfleet.host", "toolkit.docker_nvidia_runtime",
                                               CASES / "docker_nvidia_runtime")
TestAptKeyring = make_operation_tests("sparkfleet.host", "operations.apt_keyring", CASES / "apt_keyring")
TestRuntimeBundle = make_operation_tests("sparkfleet.host", "model_files.runtime_bundle", CASES / "runtime_bundle")
TestOldModelsRemoved = make_operation_tests("sparkfleet.host", "operations.old_models_removed",
                                           CASES / "old_models_removed")
TestImagePinned = make_operation_tests("sparkfleet.host", "operations.image_pinned", CASES / "image_pinned")
TestHealthGate = make_operation_tests("sparkfleet.host", "operations.health_gate", CASES / "health_gate")
TestReleaseKept = make_operation_tests("sparkfleet.host", "operations.release_kept_for_rollback",
                                       CASES / "release_kept_for_rollback")
TestPreviousRestored = make_operation_tests("sparkfleet.host", "operations.previous_release_restored",
                                            CASES / "previous_release_restored")

MANIFEST = Manifest("huggingface", "Qwen/Qwen3.5-35B-A3B-FP8", "main", "a" * 40, (
    ManifestFile("config.json", 120, blob_sha1="1" * 40),
    ManifestFile("model-00001-of-00002.safetensors", 4096, sha256="2" * 64),
    ManifestFile("model-00002-of-00002.safetensors", 4096, sha256="3" * 64),
))
MODEL_DIR = "/var/lib/sparkfleet/models/Qwen--Qwen3.5-35B-A3B-FP8@aaaaaaaaaaaaaaaa"
STATS = {
    "config.json": {"size": 120, "mtime_ns": 1_700_000_000_000_000_000, "ino": 11},
    "model-00001-of-00002.safetensors": {"size": 4096, "mtime_ns": 1_700_000_000_100_000_000, "ino": 12},
    "model-00002-of-00002.safetensors": {"size": 4096, "mtime_ns": 1_700_000_000_200_000_000, "ino": 13},
}
HASHES = {"config.json": "1" * 40, "model-00001-of-00002.safetensors": "2" * 64,
          "model-00002-of-00002.safetensors": "3" * 64}


def run_model_op(record, files, full_verify=False):
    facts = {"facts.ModelFiles": {f"model_dir={MODEL_DIR}, record=.sparkfleet-verified.json":
                                  {"record": record, "files": files}},
             "files.File": {f"path=/var/lib/sparkfleet/manifests/{MODEL_DIR.rsplit('/', 1)[1]}.json": None},
             "files.Directory": {f"path=/var/lib/sparkfleet/manifests/{MODEL_DIR.rsplit('/', 1)[1]}.json": None,
                                 "path=/var/lib/sparkfleet/manifests": {"mode": 755}}}
    host = create_host(FakeState(), facts=facts)
    with ctx_state.use(host.state), ctx_host.use(host):
        commands = [str(getattr(c, "get_raw_value", lambda: c)()) for c in
                    model_verified._inner(MANIFEST, MODEL_DIR, "http://hub:8080", "/opt/sparkfleet/runtime/r1",
                                          full_verify=full_verify)]
    return commands, host.noop_description


def converged_record():
    return {path: {**STATS[path], "hash": HASHES[path]} for path in STATS}


def test_verified_model_needs_no_commands_and_no_reads():
    commands, noop = run_model_op(converged_record(), STATS)
    assert commands == [] and noop == f"3 model files verified in {MODEL_DIR}"


def test_touched_file_is_rehashed():
    files = {**STATS, "model-00002-of-00002.safetensors": {**STATS["model-00002-of-00002.safetensors"],
                                                           "mtime_ns": 1}}
    commands, _ = run_model_op(converged_record(), files)
    assert any("sparkfleet-fetch" in c for c in commands)


def test_missing_file_is_fetched():
    files = {k: v for k, v in STATS.items() if k != "config.json"}
    commands, _ = run_model_op(converged_record(), files)
    assert commands[0] == "mkdir -p /var/lib/sparkfleet/manifests"
    assert commands[-1].startswith("PYTHONPATH=/opt/sparkfleet/runtime/r1 python3 /opt/sparkfleet/bin/sparkfleet-fetch")


def test_full_verify_rehashes_a_converged_model():
    commands, _ = run_model_op(converged_record(), STATS, full_verify=True)
    assert commands[-1].endswith("--full-verify")


DIGEST, OTHER = "sha256:" + "a" * 64, "sha256:" + "c" * 64
IMAGE, REF = "vllm/vllm-openai:v0.33.0", "vllm/vllm-openai@" + DIGEST
FAKE_DOCKER = """#!/bin/sh
# pull: exits $PULL_RC; inspect (exactly: image inspect --format FORMAT REF): prints $INSPECT; load: prints a line
case "$1" in
  pull) exit "${PULL_RC:-0}";;
  image) [ "$#" = 5 ] && [ "$3" = --format ] || { echo "docker: bad arguments: $*" >&2; exit 2; }
         printf '%s\\n' "$INSPECT";;
  load) echo "Loaded image: x";;
esac
"""


def run_pinned(tmp_path, facts, archive=None, ref=REF, digest=DIGEST, **env):
    """The op's commands, then its shell command run against a fake docker: (exit status, stderr)."""
    import os
    import subprocess

    commands, _ = run_op(image_pinned, facts, IMAGE, ref, digest, archive)
    docker = tmp_path / "bin" / "docker"
    docker.parent.mkdir(exist_ok=True)
    docker.write_text(FAKE_DOCKER)
    docker.chmod(0o755)
    shell = commands[-1].replace("/var/lib/sparkfleet/", f"{tmp_path}/")
    done = subprocess.run(["sh", "-c", shell], capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{docker.parent}:/usr/bin:/bin", **env})
    return commands, done.returncode, done.stderr.strip()


def test_tag_moved_on_the_host_pulls_the_pinned_digest(tmp_path):
    """The local tag holds other bytes: the pinned reference is absent, so it is pulled by digest and checked."""
    commands, rc, err = run_pinned(tmp_path, {"facts.DockerImageState": {f"object_id={REF}": []}},
                                   INSPECT=f"vllm/vllm-openai@{OTHER} {REF}")
    assert len(commands) == 1 and "docker pull" in commands[0] and f"REF={REF}" in commands[0]
    assert rc == 0 and err == ""


def test_registry_without_the_pinned_bytes_is_refused_naming_the_image(tmp_path):
    _, rc, err = run_pinned(tmp_path, {"facts.DockerImageState": {f"object_id={REF}": []}}, PULL_RC="1")
    assert rc == 1 and len(err.splitlines()) == 1
    assert IMAGE in err and DIGEST in err and "refused" in err


def test_pulled_image_with_other_digests_is_refused_naming_both(tmp_path):
    _, rc, err = run_pinned(tmp_path, {"facts.DockerImageState": {f"object_id={REF}": []}},
                            INSPECT=f"vllm/vllm-openai@{OTHER}")
    assert rc == 1 and len(err.splitlines()) == 1
    assert IMAGE in err and DIGEST in err and OTHER in err


def archive_facts():
    return {"facts.DockerImageState": {f"object_id={DIGEST}": []},
            "files.File": {"path=/var/lib/sparkfleet/vllm.tar": None},
            "files.Directory": {"path=/var/lib/sparkfleet/vllm.tar": None, "path=/var/lib/sparkfleet": {"mode": 755}}}


def test_missing_image_is_loaded_from_the_archive_and_checked(tmp_path):
    archive = tmp_path / "vllm.tar"
    archive.write_bytes(b"docker save output")
    commands, rc, _ = run_pinned(tmp_path, archive_facts(), str(archive), ref=DIGEST, INSPECT=DIGEST)
    assert commands[0] == f"FileUploadCommand({archive}, /var/lib/sparkfleet/vllm.tar)"
    assert rc == 0 and not archive.exists()  # the upload (here the same path) is removed after the load


def test_archive_holding_other_bytes_is_refused_naming_both(tmp_path):
    archive = tmp_path / "vllm.tar"
    archive.write_bytes(b"docker save output")
    _, rc, err = run_pinned(tmp_path, archive_facts(), str(archive), ref=DIGEST, INSPECT=OTHER)
    assert rc == 1 and len(err.splitlines()) == 1
    assert IMAGE in err and DIGEST in err and OTHER in err


def run_op(op, facts: dict, *args, op_name: str | None = "an operation", **kwargs):
    """Commands an operation yields on a host named spark-1 with these facts, as text, and its noop."""
    host = create_host(FakeState(), facts=facts)
    host.name = "spark-1"
    host.current_op_global_arguments = {"name": op_name}
    with ctx_state.use(host.state), ctx_host.use(host):
        commands = [c if isinstance(c, str) else c.get_raw_value() if hasattr(c, "get_raw_value") else repr(c)
                    for c in op._inner(*args, **kwargs)]
    return commands, host.noop_description


ENV = "/etc/sparkfleet/engine.env"
SECRET = "VLLM_API_KEY=sk-rotated-4242\n"


def secret_facts(sha256, mode):
    found = {} if mode is None else {ENV: {"type": "file", "mode": int(str(mode), 8), "user": "root", "group": "root",
                                          "sha256": sha256}}
    return {"state.HostState": {"files": found, "units": {}}}


def test_secret_file_is_made_0600_before_its_bytes_land_and_never_shows_them():
    commands, _ = run_op(secret_file, secret_facts(None, None), ENV, SECRET)
    assert commands[0] == ("mkdir -p /etc/sparkfleet && rm -f /etc/sparkfleet/engine.env.sparkfleet-new "
                           "&& ( umask 077 && : > /etc/sparkfleet/engine.env.sparkfleet-new )")
    assert commands[1].startswith("FileUploadCommand(<_io.StringIO object at ")
    assert commands[1].endswith(", /etc/sparkfleet/engine.env.sparkfleet-new)")
    assert commands[2] == "mv -f /etc/sparkfleet/engine.env.sparkfleet-new /etc/sparkfleet/engine.env"
    assert not any("sk-rotated" in c for c in commands)


def test_secret_file_changed_content_is_seen_by_hash_and_replaced():
    commands, _ = run_op(secret_file, secret_facts("0" * 64, 600), ENV, SECRET)
    assert len(commands) == 3 and commands[2].startswith("mv -f ")
    assert not any("sk-rotated" in c for c in commands)


def test_secret_file_current_is_a_noop_and_a_loose_mode_is_tightened():
    digest = "92de184ac1eeb7142f4292ceb7df560bf5ec905f6b8589084bc5dbf44883e489"  # sha256 of SECRET
    assert run_op(secret_file, secret_facts(digest, 600), ENV, SECRET) == ([], f"{ENV} is current (0600)")
    assert run_op(secret_file, secret_facts(digest, 644), ENV, SECRET)[0] == [f"chmod 0600 {ENV}"]


SECRET_SHA = "92de184ac1eeb7142f4292ceb7df560bf5ec905f6b8589084bc5dbf44883e489"  # sha256 of SECRET


@pytest.mark.parametrize("found", [(None, None), (SECRET_SHA, 600)], ids=["would change", "current"])
def test_secret_file_refuses_to_run_unnamed_where_pyinfra_would_print_its_arguments(found):
    """Refused at the call, on a host it would change and on one where it is current alike (its generator, which
    only_on_drift and pyinfra ask, never looks at how it was called)."""
    host = create_host(FakeState(), facts=secret_facts(*found))
    with ctx_state.use(host.state), ctx_host.use(host):
        with pytest.raises(OperationValueError, match=r"secret_file\(/etc/sparkfleet/engine.env\) needs name="):
            secret_file(ENV, SECRET)
        with pytest.raises(OperationValueError, match=r"needs name="):
            secret_file(dest=ENV, content=SECRET, name="")


UNIT = "/etc/systemd/system/sparkfleet-vllm.service"
RAY_UNIT = "/etc/systemd/system/sparkfleet-ray.service"
KEPT = "/etc/sparkfleet/previous"
CLEAR_KEPT = f"rm -f {KEPT}/sparkfleet-*.service"
KEEP_ENV = env_command("env-keep")  # its effect on an engine env file: test_hostile_values.py


def unit_facts(*units: str, kept: str | None = '{"release_id": "999999999999"}') -> dict:
    """A host with these sparkfleet unit files (names) and this kept record (text; None: none kept)."""
    found = {f"/etc/systemd/system/{unit}": {"type": "file", "mode": 0o644, "user": "root", "group": "root",
                                             "sha256": "1" * 64} for unit in units}
    return {"state.HostState": {"files": found, "units": {}}, "facts.JsonFile": {f"path={KEPT}/release.json": kept}}


def kept_units(*paths: str) -> list[str]:
    return [f"mkdir -p {KEPT} && {CLEAR_KEPT} && cp -p {' '.join(paths)} /etc/sparkfleet/release.json {KEPT}/ && "
            f"{KEEP_ENV}"]


def test_release_is_kept_without_its_secret_when_a_new_release_replaces_it():
    commands, _ = run_op(release_kept_for_rollback, unit_facts("sparkfleet-vllm.service"), "aaaaaaaaaaaa",
                         "bbbbbbbbbbbb")
    assert commands == kept_units(UNIT)


def test_every_unit_of_the_running_release_is_kept_its_services_and_ray_node_too():
    """The RAG services' units go aside with the engine's (a rollback brings them back); the share is no release's."""
    units = ("sparkfleet-ray.service", "sparkfleet-share.service", "sparkfleet-vllm-embed.service",
             "sparkfleet-vllm-rerank.service", "sparkfleet-vllm.service", "sparkfleet-watchdog.service")
    assert run_op(release_kept_for_rollback, unit_facts(*units), "aaaaaaaaaaaa", "bbbbbbbbbbbb")[0] == kept_units(
        RAY_UNIT, "/etc/systemd/system/sparkfleet-vllm-embed.service",
        "/etc/systemd/system/sparkfleet-vllm-rerank.service", UNIT)
    # a worker leaving its group: its Ray unit is kept though the new (single) release writes only a vLLM unit
    assert run_op(release_kept_for_rollback, unit_facts("sparkfleet-ray.service"), "aaaaaaaaaaaa",
                  "bbbbbbbbbbbb")[0] == kept_units(RAY_UNIT)
    # a first rollout with no kept record yet keeps the running release
    assert run_op(release_kept_for_rollback, unit_facts("sparkfleet-vllm.service", kept=None), "aaaaaaaaaaaa",
                  "bbbbbbbbbbbb")[0] == kept_units(UNIT)


def test_nothing_is_kept_for_a_rerun_a_first_release_or_a_release_kept_already():
    assert run_op(release_kept_for_rollback, unit_facts("sparkfleet-vllm.service"), "bbbbbbbbbbbb",
                  "bbbbbbbbbbbb") == ([], "no running release is being replaced")
    assert run_op(release_kept_for_rollback, unit_facts(), None, "bbbbbbbbbbbb")[0] == []
    # a run of the new release stopped after the keep: its units may be the new ones now, the kept copy stays
    assert run_op(release_kept_for_rollback, unit_facts("sparkfleet-vllm.service", kept='{"release_id": '
                                                                                       '"aaaaaaaaaaaa"}'),
                  "aaaaaaaaaaaa", "bbbbbbbbbbbb")[0] == []


PREVIOUS = {"release_id": "aaaaaaaaaaaa", "model_dir": "/m/Q--M@a", "served_model_name": "Q", "api_host": "0.0.0.0",
            "api_port": 8000, "engine_port": 18000, "health_timeout_s": 60, "tools": True}


def swapped_in(unit: str) -> str:
    live, kept = f"/etc/systemd/system/{unit}", f"{KEPT}/{unit}"
    return (f"{{ [ -e {kept} ] || {{ echo 'spark-1: {kept} is missing: nothing to roll back to; roll forward "
            f"instead' >&2; exit 1; }}; }} && {{ [ ! -e {live} ] || mv -f {live} {kept}.swap; }} && mv -f {kept} "
            f"{live} && {{ [ ! -e {kept}.swap ] || mv -f {kept}.swap {kept}; }}")


def set_aside(unit: str) -> str:
    live = f"/etc/systemd/system/{unit}"
    return f"if [ -e {live} ]; then systemctl disable --now {unit} && mv -f {live} {KEPT}/{unit}; fi"


RECORD_SWAP = ("cp -p /etc/sparkfleet/release.json /etc/sparkfleet/previous/release.json.swap && "
               "cp -p /etc/sparkfleet/previous/release.json /etc/sparkfleet/release.json && "
               "mv /etc/sparkfleet/previous/release.json.swap /etc/sparkfleet/previous/release.json")


def test_rollback_swaps_unit_and_record_and_keeps_todays_secret():
    """A record written before records named their units rolls back as it did: its role's units, the services'
    units left as they are."""
    commands, _ = run_op(previous_release_restored, unit_facts("sparkfleet-vllm-embed.service"), PREVIOUS,
                         {"release_id": "bbbbbbbbbbbb"})
    assert commands == [
        ("test -d /m/Q--M@a || { echo 'spark-1: the previous model directory /m/Q--M@a is gone: roll forward instead' "
         ">&2; exit 1; }"),
        RECORD_SWAP,
        env_command("env-restore"),
        set_aside("sparkfleet-ray.service"),
        swapped_in("sparkfleet-vllm.service"),
        "systemctl daemon-reload",
        "systemctl enable sparkfleet-vllm.service && { systemctl reset-failed sparkfleet-vllm.service 2>/dev/null; "
        "systemctl restart sparkfleet-vllm.service; }",
    ]


def restart_if_changed(unit: str) -> str:
    return (f"systemctl enable {unit} && {{ [ -n \"$same_env\" ] && cmp -s {KEPT}/{unit} /etc/systemd/system/{unit} "
            f"&& systemctl is-active -q {unit} || {{ systemctl reset-failed {unit} 2>/dev/null; systemctl restart {unit}; }}; }}")


def test_a_record_that_names_its_units_gets_every_one_back_and_none_newer():
    """The services' units swap back with the engine's; a service the newer release added is set aside (a second
    rollback returns it); only what changed back (its unit, or the engine env) or is down restarts."""
    previous = {**PREVIOUS, "units": ["sparkfleet-vllm.service", "sparkfleet-vllm-embed.service"]}
    live = unit_facts("sparkfleet-share.service", "sparkfleet-vllm-embed.service", "sparkfleet-vllm-rerank.service",
                      "sparkfleet-vllm.service")
    commands, _ = run_op(previous_release_restored, live, previous, {"release_id": "bbbbbbbbbbbb"})
    env = "/etc/sparkfleet/engine.env"
    assert commands[1:] == [
        RECORD_SWAP,
        swapped_in("sparkfleet-vllm.service"),
        swapped_in("sparkfleet-vllm-embed.service"),
        set_aside("sparkfleet-vllm-rerank.service"),
        "systemctl daemon-reload",
        (f"before=$(sha256sum < {env}) && {env_command('env-restore')} && "
         f"{{ same_env=; [ \"$before\" != \"$(sha256sum < {env})\" ] || same_env=1; }} && "
         f"{restart_if_changed('sparkfleet-vllm.service')} && {restart_if_changed('sparkfleet-vllm-embed.service')}"),
    ]
    # a pair's head: its Ray node first; a unit no release runs (the share) is never touched
    head = {**PREVIOUS, "units": ["sparkfleet-ray.service", "sparkfleet-vllm.service"]}
    commands = run_op(previous_release_restored, live, head, {"release_id": "bbbbbbbbbbbb"})[0]
    assert commands[2:5] == [swapped_in("sparkfleet-ray.service"), swapped_in("sparkfleet-vllm.service"),
                             set_aside("sparkfleet-vllm-embed.service")]
    assert not any("sparkfleet-share" in c for c in commands)


def test_the_rollbacks_env_edits_go_through_the_env_files_owner_with_no_secret_on_the_command_line():
    """No grep, sed or awk of engine.env: the host module edits it (test_hostile_values.py runs its edits), and no
    command names the API key's variable, let alone a value."""
    kept = run_op(release_kept_for_rollback, unit_facts("sparkfleet-vllm.service"), "aaaaaaaaaaaa",
                  "bbbbbbbbbbbb")[0]
    restored = run_op(previous_release_restored, unit_facts(), PREVIOUS, {"release_id": "bbbbbbbbbbbb"})[0]
    named = run_op(previous_release_restored, unit_facts(), {**PREVIOUS, "units": ["sparkfleet-vllm.service"]},
                   {"release_id": "bbbbbbbbbbbb"})[0]
    for command in kept + restored + named:
        assert not {"grep", "sed", "awk"} & set(re.split(r"[\s;|&(){}]+", command)), command
        assert API_KEY_VAR not in command, command
    assert kept[0].endswith(env_command("env-keep")) and env_command("env-restore") in restored
    assert env_command("env-restore") in named[-1]
    assert env_command("env-keep").startswith("python3 /opt/sparkfleet/bin/sparkfleet_host env-keep ")


def test_rollback_to_the_running_release_is_a_noop():
    assert run_op(previous_release_restored, {}, PREVIOUS, {"release_id": "aaaaaaaaaaaa"}) == (
        [], "release aaaaaaaaaaaa is already the running one")


def test_rollback_problems_name_what_is_missing():
    assert rollback_problem(None, "/etc/sparkfleet/previous/release.json") == Unreadable(
        "/etc/sparkfleet/previous", "no previous release kept: nothing to roll back to")
    old = {k: v for k, v in PREVIOUS.items() if k not in ("api_host", "health_timeout_s")}
    assert rollback_problem({**old, "tools": "yes"}, "prev.json") == Unreadable(
        "prev.json", "the release record lacks api_host, health_timeout_s, tools (written by an older sparkfleet?)")
    assert rollback_problem(PREVIOUS, "prev.json") is None


EMBED = {"kind": "embedding", "unit": "sparkfleet-vllm-embed.service", "container": "vllm-embed",
         "served_model_name": "E", "api_port": 8001}


@pytest.mark.parametrize("units, services", [
    (["sparkfleet-vllm.service; rm -rf /"], {}),  # a kept record is host output: a unit is a release unit or nothing
    (["sparkfleet-share.service"], {}),
    (["sparkfleet-vllm.service", "sparkfleet-vllm.service"], {}),
    ([], {}),
    ("sparkfleet-vllm.service", {}),
    (["sparkfleet-vllm.service"], {"embed": EMBED}),  # a service the units do not name
    (["sparkfleet-vllm.service", "sparkfleet-vllm-embed.service"], {"embed": {**EMBED, "container": "x; reboot"}}),
    (["sparkfleet-vllm.service", "sparkfleet-vllm-embed.service"], {"embed": {**EMBED, "api_port": "8001"}}),
    (["sparkfleet-vllm.service", "sparkfleet-vllm-embed.service"], ["embed"]),
])
def test_a_kept_records_units_and_services_are_checked_before_anything_is_swapped(units, services):
    problem = rollback_problem({**PREVIOUS, "units": units, "services": services}, "prev.json")
    assert problem is not None and problem.source == "prev.json", problem


def test_a_kept_record_naming_its_services_units_rolls_back():
    record = {**PREVIOUS, "units": ["sparkfleet-vllm.service", "sparkfleet-vllm-embed.service"],
              "services": {"embed": EMBED}}
    assert rollback_problem(record, "prev.json") is None


MODELS = "/var/lib/sparkfleet/models"


@pytest.mark.parametrize("record, problem", [
    ("{ truncated", "not valid JSON (Expecting property name enclosed in double quotes: line 1 column 3 (char 2))"),
    ("", "not valid JSON (Expecting value: line 1 column 1 (char 0))"),
    ('"release"', "holds a JSON str, not an object"),
    ('["a"]', "holds a JSON list, not an object"),
])
def test_cleanup_stops_on_an_unreadable_release_record(record, problem):
    facts = {"facts.JsonFile": {"path=/etc/sparkfleet/release.json": record},
             "facts.ModelDirs": {f"model_root={MODELS}": [f"{MODELS}/Q--M@a", f"{MODELS}/Q--M@b"]}}
    with pytest.raises(OperationError) as raised:
        run_op(old_models_removed, facts, MODELS, [f"{MODELS}/Q--M@b"])
    assert str(raised.value) == (f"spark-1: /etc/sparkfleet/release.json: {problem}: no model directory was removed; "
                                 "repair or remove the file by hand")


def test_cleanup_stops_on_an_unreadable_listing():
    facts = {"facts.JsonFile": {"path=/etc/sparkfleet/release.json": None},
             "facts.ModelDirs": {f"model_root={MODELS}": Unreadable(f"find {MODELS}", "listed 'x'")}}
    with pytest.raises(OperationError, match=r"^spark-1: find /var/lib/sparkfleet/models: listed 'x': no model"):
        run_op(old_models_removed, facts, MODELS, [])


@pytest.mark.parametrize("text, problem", [
    ("{ not json", "not valid JSON (Expecting property name enclosed in double quotes: line 1 column 3 (char 2))"),
    ('"runtimes"', "holds a JSON str, not an object"),
    ("", "not valid JSON (Expecting value: line 1 column 1 (char 0))"),
])
def test_unreadable_daemon_json_is_refused_not_overwritten(text, problem):
    with pytest.raises(OperationError) as raised:
        run_op(docker_nvidia_runtime, {"facts.JsonFile": {"path=/etc/docker/daemon.json": text}})
    assert str(raised.value) == (f"spark-1: /etc/docker/daemon.json: {problem}: fix it by hand; "
                                 "sparkfleet will not overwrite it")


def completed(success: bool, commands: list) -> OperationMeta:
    meta = OperationMeta("hash", None)
    meta.set_complete(success, commands, CommandOutput([]))
    return meta


def test_health_gate_results_come_from_the_gate_operation_not_its_name():
    state = FakeState()
    record_health_gate(state, "spark-1", completed(True, ["check"]))
    record_health_gate(state, "spark-2", completed(False, ["check"]))
    record_health_gate(state, "spark-3", completed(True, []))  # skipped: nothing changed
    record_health_gate(state, "spark-4", OperationMeta("hash", None))  # never ran: an earlier op failed
    assert health_gate_results(state) == {"spark-1": "passed", "spark-2": "failed"}


def run_bundle(tmp_path, sha256):
    """runtime_bundle's commands with RUNTIME_DIR in tmp_path, run here: (exit status, stderr, runtime dir)."""
    import hashlib
    import subprocess
    import tarfile

    from sparkfleet.host.model_files import runtime_bundle

    payload = tmp_path / "payload" / "openai"
    payload.mkdir(parents=True)
    (payload / "__init__.py").write_text("")
    tarball = tmp_path / "runtime-x86_64-py3.11-abc.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(payload, arcname="openai")
    name, runtime = tarball.name.removesuffix(".tar.gz"), tmp_path / "runtime"
    facts = {"state.HostState": {"files": {}, "units": {}},
             "files.Directory": {f"path=/opt/sparkfleet/runtime/{name}.tar.gz": None,
                                 "path=/opt/sparkfleet/runtime": {"mode": 755}},
             "files.File": {f"path=/opt/sparkfleet/runtime/{name}.tar.gz": None}}
    commands, _ = run_op(runtime_bundle, facts, str(tarball), sha256(hashlib.sha256(tarball.read_bytes()).hexdigest()))
    assert commands[1].startswith("FileUploadCommand(")
    runtime.mkdir()
    (runtime / tarball.name).write_bytes(tarball.read_bytes())  # what the upload puts there
    shell = commands[-1].replace("/opt/sparkfleet/runtime", str(runtime))
    done = subprocess.run(["sh", "-c", shell], capture_output=True, text=True)
    return done.returncode, done.stderr.strip(), runtime / name


def test_bundle_with_its_recorded_hash_is_unpacked(tmp_path):
    rc, err, target = run_bundle(tmp_path, lambda real: real)
    assert rc == 0 and err == "" and (target / "openai" / "__init__.py").exists()
    assert not (target.parent / f"{target.name}.tar.gz").exists()


def test_bundle_whose_hash_differs_is_refused_and_nothing_unpacked(tmp_path):
    recorded = "e" * 64
    rc, err, target = run_bundle(tmp_path, lambda real: recorded)
    assert rc == 1 and len(err.splitlines()) == 1 and recorded in err and "refused" in err
    assert target.name in err and not target.exists() and not target.with_name(f"{target.name}.partial").exists()
    assert not (target.parent / f"{target.name}.tar.gz").exists()


TestManagedFile = make_operation_tests("sparkfleet.host", "managed.managed_file", CASES / "managed_file")
TestManagedFiles = make_operation_tests("sparkfleet.host", "managed.managed_files", CASES / "managed_files")
TestManagedDirectory = make_operation_tests("sparkfleet.host", "managed.managed_directory", CASES / "managed_directory")
TestManagedPermissions = make_operation_tests("sparkfleet.host", "managed.managed_permissions",
                                              CASES / "managed_permissions")
TestManagedAbsent = make_operation_tests("sparkfleet.host", "managed.managed_absent", CASES / "managed_absent")
TestManagedUnit = make_operation_tests("sparkfleet.host", "managed.managed_unit", CASES / "managed_unit")
TestManagedUser = make_operation_tests("sparkfleet.host", "managed.managed_user", CASES / "managed_user")
TestManagedPackages = make_operation_tests("sparkfleet.host", "managed.managed_packages", CASES / "managed_packages")


def test_the_engine_image_is_read_from_dockers_socket_as_the_cli_would_print_it(tmp_path):
    """curl on Docker's socket where curl is installed (the image itself, or Docker's "no such image" message),
    the CLI otherwise: the same list either way, and a hostile reference stays one quoted word in both."""
    fact = DockerImageState()
    image = {"Id": DIGEST, "RepoDigests": [REF]}
    assert fact.process([json.dumps(image)]) == [image]
    assert fact.process(['{"message": "No such image: x"}']) == []
    assert fact.process([json.dumps([image])]) == [image]
    hostile = "x'; touch /tmp/owned #"
    command = fact.command(hostile).get_raw_value()
    assert command.count(shlex.quote(hostile)) == 1 and command.count(shlex.quote(f"http://docker/images/{hostile}/json")) == 1


def test_a_rollbacks_restart_of_an_older_records_units_resets_their_start_limit_first():
    """A planned restart never spends the start limit meant to end a crash loop (issue 35)."""
    from sparkfleet.host.operations import units_restored

    restarts = [c for c in units_restored("single", "spark-1") if "systemctl restart" in c]
    assert restarts and all(c.index("systemctl reset-failed") < c.index("systemctl restart") for c in restarts)
