"""engine_env is part of the release (issue 35): an env change alone is a new release id (staged, gated by the
speed gate, rolled back like any), the same env gives the same id on every run, and the id is keyed: nothing in
it, or in the plan, reveals a value (not a plain hash of it)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

from sparkfleet.model.manifest import Manifest, ManifestFile
from sparkfleet.release.plan import plan_hosts
from tests.unit.helpers import ROOT, host_data, qwen35_config

MANIFEST = Manifest("modelscope", "Qwen/Qwen3.5-35B-A3B-FP8", "master", "a" * 40,
                    (ManifestFile("model.safetensors", 35 * 10**9, sha256="0" * 64),
                     ManifestFile("config.json", 100, sha256="1" * 64)))
SECRET = "sk-live-0123456789"


def plan(**overrides):
    [found] = plan_hosts([("spark-a", host_data(**{"api_key": "fleet-key-1", "sim_engine_knobs": True, **overrides}))],
                         resolve=lambda s: (MANIFEST, qwen35_config(), None))
    return found


def test_an_env_change_alone_is_a_new_release():
    base = plan(engine_env={"SIM_TOKENS_PER_S": "50"})
    assert base.release_id and base.release_id != plan(engine_env={"SIM_TOKENS_PER_S": "30"}).release_id
    assert base.release_id != plan(engine_env={"SIM_TOKENS_PER_S_X": "50"}).release_id  # a name is part of it
    assert base.release_id != plan().release_id


def test_no_env_keeps_the_release_id_it_had():
    """A fleet without engine_env keeps its ids (and its units): upgrading sparkfleet restarts nothing there."""
    bare = plan()
    body = bare._release_body(True)
    assert bare.release_id == hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]
    assert "env" not in body


def test_the_same_env_gives_the_same_id_on_every_run():
    env = {"SIM_B": "2", "SIM_A": SECRET}  # the sim's knobs: engine_env passes reviewed names only
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); from tests.unit.test_release_env import plan; "
            "print(plan(engine_env=json.loads(sys.argv[2])).release_id)")
    runs = {subprocess.run([sys.executable, "-c", code, str(ROOT), json.dumps(env)], capture_output=True, text=True,
                           check=True, cwd=ROOT).stdout.strip()}  # another process: another hash seed
    assert runs == {plan(engine_env=dict(reversed(env.items()))).release_id}  # order of the keys: same release


def test_the_id_is_keyed_and_reveals_no_value():
    secret = plan(engine_env={"SIM_TOKEN_X": SECRET})
    body = secret._release_body(True)
    assert SECRET not in json.dumps(body) and SECRET not in json.dumps(secret.to_dict(), default=str)
    plain = [hashlib.sha256(text.encode()).hexdigest() for text in
             (SECRET, json.dumps({"SIM_TOKEN_X": SECRET}), json.dumps({"SIM_TOKEN_X": SECRET}, sort_keys=True),
              json.dumps(sorted({"SIM_TOKEN_X": SECRET}.items())))]
    assert body["env"] not in plain  # not a plain hash: a guessed value cannot be checked against the id
    other_key = plan(api_key="fleet-key-2", engine_env={"SIM_TOKEN_X": SECRET})
    assert other_key._release_body(True)["env"] != body["env"]  # keyed: another fleet's key, another digest
