"""The plan: engine arguments, the rendered unit, the release id, the manifest from a hub."""

import hashlib
import json

import pytest

from sparkfleet.model.hubs import hub_resolver
from sparkfleet.release.engines.vllm import flag_table
from sparkfleet.release.plan import plan_hosts
from sparkfleet.release.render import systemd_quote
from sparkfleet.contract.settings import SettingsError

from .helpers import host_data

REFERENCE_FLAGS = [
    "--served-model-name", "Qwen3.5-35B-A3B", "--host", "127.0.0.1", "--port", "18000",
    "--max-model-len", "262144", "--gpu-memory-utilization", "0.88", "--enable-prefix-caching",
    "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder", "--reasoning-parser", "qwen3",
    "--attention-backend", "FLASH_ATTN", "--limit-mm-per-prompt", '{"image": 0, "video": 0}',
]


def offline_plan(**overrides):
    [plan] = plan_hosts([("spark-a", host_data(**overrides))], resolve=False)
    return plan


def test_engine_args_are_the_reference_deployment():
    plan = offline_plan()
    assert plan.engine_args[0] == plan.model_dir
    assert plan.engine_args[1:] == REFERENCE_FLAGS
    assert flag_table("0.33.0").problems(plan.engine_args) == []


def test_optional_flags_follow_settings():
    args = offline_plan(enable_prefix_caching=False, max_num_seqs=4, reasoning_parser=None).engine_args
    assert "--no-enable-prefix-caching" in args and "--enable-prefix-caching" not in args
    assert args[args.index("--max-num-seqs") + 1] == "4"
    assert "--reasoning-parser" not in args


def test_unit_runs_the_pinned_image_safely():
    plan = offline_plan()
    unit = plan.render_unit()
    exec_start = unit[unit.index("ExecStart="):unit.index("ExecStop=")]
    for expected in ["--rm", "--name vllm", "--gpus all", "--ipc host", "--network host",
                     "--env-file /etc/sparkfleet/engine.env",
                     f"--volume {plan.model_dir}:{plan.model_dir}:ro", "vllm/vllm-openai:v0.33.0",
                     '--limit-mm-per-prompt "{\\"image\\": 0, \\"video\\": 0}"']:
        assert expected in exec_start, expected
    assert "--privileged" not in unit and "seccomp" not in unit
    assert "Restart=on-failure" in unit and "TimeoutStartSec=1800" in unit
    assert "ExecStartPre=/opt/sparkfleet/bin/sparkfleet-memcheck 0.88" in unit
    assert "ExecStartPre=-/usr/bin/docker rm -f vllm" in unit
    # the image is sh's "$1", never parsed as shell ($$ is systemd's escape for $)
    assert ("ExecStartPre=/bin/sh -c 'docker image inspect \"$$1\" >/dev/null 2>&1 || docker pull \"$$1\"' "
            "pull vllm/vllm-openai:v0.33.0\n") in unit


def test_secrets_stay_out_of_the_unit():
    plan = offline_plan(api_host="0.0.0.0", api_key="s3cret-key", hub_token="hf_tok")
    assert "s3cret-key" not in plan.render_unit() and "hf_tok" not in plan.render_unit()
    assert "s3cret-key" not in " ".join(plan.engine_args)
    assert "VLLM_API_KEY=s3cret-key" in plan.render_engine_env()
    assert "HF_TOKEN=hf_tok" in plan.render_hub_env()


def test_opt_in_container_privileges():
    unit = offline_plan(privileged=True, seccomp_unconfined=True).render_unit()
    assert "--privileged" in unit and "--security-opt seccomp=unconfined" in unit


def test_systemd_quoting():
    assert systemd_quote("plain-arg") == "plain-arg"
    assert systemd_quote("50%") == "50%%"
    assert systemd_quote('{"a": 1}') == '"{\\"a\\": 1}"'
    assert systemd_quote("$HOME") == "\"$$HOME\""


def hub_plans(*hosts):
    """Plans whose manifests are asked of a hub (the test's local one)."""
    return plan_hosts(list(hosts), resolve=hub_resolver)


@pytest.mark.parametrize("hub,revision", [("modelscope", "master"), ("huggingface", "main")])
def test_manifest_from_each_hub(local_hub, hub, revision):
    [plan] = hub_plans(("spark-a", host_data(model_hub=hub, model_revision=revision, hub_endpoint=local_hub)))
    m = plan.manifest
    assert m.hub == hub and len(m.files) >= 8
    assert {f.path for f in m.files} >= {"config.json", "model.safetensors.index.json"}
    shards = [f for f in m.files if f.path.endswith(".safetensors")]
    assert len(shards) >= 4 and all(f.sha256 and f.size > 0 for f in shards)
    assert plan.release_id and plan.model_dir.startswith("/var/lib/sparkfleet/models/Qwen--Qwen3.5-35B-A3B-FP8@")


def test_hf_manifest_hashes_match_the_bytes(local_hub, tmp_path):
    from huggingface_hub import snapshot_download

    [plan] = hub_plans(("a", host_data(model_hub="huggingface", model_revision="main", hub_endpoint=local_hub)))
    local = snapshot_download(plan.manifest.repo, revision=plan.manifest.commit, endpoint=local_hub,
                              local_dir=tmp_path / "m")
    for f in plan.manifest.files:
        data = (tmp_path / "m" / f.path).read_bytes()
        if f.sha256:
            assert hashlib.sha256(data).hexdigest() == f.sha256
        else:
            assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == f.blob_sha1
    assert local


def test_release_id_is_content_addressed(local_hub):
    def release(**o):
        [p] = hub_plans(("a", host_data(hub_endpoint=local_hub, **o)))
        return p.release_id

    assert release() == release()
    assert release() != release(max_model_len=131072)
    assert release() != release(engine_image="vllm/vllm-openai:v0.33.1")


def test_unreachable_hub_still_plans_the_rest():
    why = "cannot resolve modelscope:Qwen/Qwen3.5-35B-A3B-FP8@master: ConnectionError"
    [plan] = plan_hosts([("a", host_data())], resolve=lambda settings: (None, None, why))
    assert plan.manifest is None and plan.hub_error == why
    assert plan.to_dict()["release_id"] is None and "ExecStart=" in plan.to_dict()["unit"]


def test_pinned_commit_plans_offline_from_the_cache(local_hub):
    [online] = hub_plans(("a", host_data(model_hub="huggingface", model_revision="main", hub_endpoint=local_hub)))
    from sparkfleet.model import hubs

    hubs._resolve_manifest.cache_clear()
    [offline] = hub_plans(("a", host_data(model_hub="huggingface", model_revision=online.manifest.commit,
                                          hub_endpoint="http://127.0.0.1:9")))
    assert offline.manifest.digest == online.manifest.digest
    assert json.dumps(offline.to_dict()["manifest"]["files"]) == json.dumps(online.to_dict()["manifest"]["files"])


def test_peer_mode_one_seed_then_the_lan(local_hub):
    plans = hub_plans(*[(f"spark-{i}", host_data(hub_endpoint=local_hub, ssh_hostname=f"10.0.0.{i}"))
                        for i in (1, 2, 3)])
    assert [p.model_role for p in plans] == ["hub", "peer", "peer"]
    dir_name = plans[0].manifest.dir_name
    assert plans[1].peer_urls == [f"http://10.0.0.1:8090/{dir_name}", f"http://10.0.0.3:8090/{dir_name}"]
    assert plans[2].peer_urls[0] == f"http://10.0.0.1:8090/{dir_name}"


def test_other_sources(local_hub):
    hub_only = hub_plans(*[(f"s{i}", host_data(hub_endpoint=local_hub, model_source="hub")) for i in (1, 2)])
    assert [p.model_role for p in hub_only] == ["hub", "hub"]
    pushed = hub_plans(("s1", host_data(hub_endpoint=local_hub, model_source="controller", lan_address="s1.lan")))
    assert pushed[0].model_role == "controller" and pushed[0].lan_address == "s1.lan"


def test_release_record_keeps_current_and_previous(local_hub):
    [old] = hub_plans(("a", host_data(hub_endpoint=local_hub, max_model_len=131072)))
    [new] = hub_plans(("a", host_data(hub_endpoint=local_hub)))
    first = old.release_record(None)
    assert first["previous"] is None and first["model_history"] == [old.model_dir]
    second = new.release_record(first)
    assert second["release_id"] == new.release_id and second["previous"]["release_id"] == old.release_id
    assert new.release_record(second) == second  # a re-run writes the same record
    assert "previous" not in second["previous"]
    third = old.release_record(dict(second, model_dir="/m/other", model_history=[new.model_dir, "/m/other", "/m/x"]))
    assert third["previous"]["release_id"] == new.release_id and len(third["model_history"]) == 2


@pytest.fixture
def full_size_model():
    """A resolver answering the default model as the hub lists it (14 shards, 35 GB), without a 35 GB hub."""
    from sparkfleet.model.manifest import Manifest, ManifestFile
    from sparkfleet.contract.recipes import known_model

    files = tuple(ManifestFile(f"model-{i:05d}-of-00014.safetensors", 2_500_000_000, sha256=f"{i:064x}")
                  for i in range(1, 15)) + (ManifestFile("config.json", 4000, blob_sha1="c" * 40),)
    manifest = Manifest("modelscope", "Qwen/Qwen3.5-35B-A3B-FP8", "master", "f" * 40, files)
    return lambda settings: (manifest, known_model("Qwen/Qwen3.5-35B-A3B-FP8").config, None)


def test_default_release_fits_a_spark(full_size_model):
    [plan] = plan_hosts([("a", host_data())], resolve=full_size_model)
    fit = plan.to_dict()["fit"]
    assert fit["kv_bytes_per_token"] == 20480 and fit["fits"] and fit["seqs_at_max_model_len"] >= 1
    assert 50.3 < fit["decode_tokens_per_s_at_0"] < 100  # the roofline bounds the measured 50.3 tok/s


def test_oversized_context_is_refused_with_the_length_that_fits(full_size_model):
    with pytest.raises(SettingsError) as caught:
        plan_hosts([("a", host_data(gpu_memory_utilization=0.33))], resolve=full_size_model)
    message = str(caught.value)
    assert "a: max_model_len=262144 needs" in message and "set max_model_len <= 192512" in message
    [plan] = plan_hosts([("a", host_data(gpu_memory_utilization=0.33, max_model_len=192512))], resolve=full_size_model)
    assert plan.fit.fits
