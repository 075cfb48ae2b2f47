"""Each refusal of bad settings: before any host is touched, naming host, problem and fix."""

import pytest

from sparkfleet.release.plan import plan_hosts
from sparkfleet.contract.settings import Settings, SettingsError, parse_settings

from .helpers import DEFAULTS, host_data


def refusal(**overrides) -> str:
    with pytest.raises(SettingsError) as caught:
        plan_hosts([("spark-x", host_data(**overrides))], resolve=False)
    return str(caught.value)


def test_defaults_are_the_known_good_release():
    s = parse_settings("spark-a", host_data())
    assert s.model_repo == "Qwen/Qwen3.5-35B-A3B-FP8" and s.model_hub == "modelscope"
    assert (s.served_model_name, s.api_port, s.max_model_len, s.gpu_memory_utilization) == (
        "Qwen3.5-35B-A3B", 8000, 262144, 0.88)
    assert s.engine_image.endswith(":v0.33.0")


def test_defaults_plan_without_a_hub():
    [plan] = plan_hosts([("spark-a", host_data())], resolve=False)
    assert plan.manifest is None and "--served-model-name" in plan.engine_args


def test_unknown_key_gets_did_you_mean():
    message = refusal(max_model_length=1000)
    assert "spark-x: unknown setting `max_model_length`" in message
    assert "did you mean `max_model_len`?" in message


def test_wrong_type_names_the_setting():
    message = refusal(api_port="eighty")
    assert "spark-x: setting `api_port` = 'eighty' is invalid" in message


def test_out_of_range_utilization():
    assert "`gpu_memory_utilization` = 1.5 is invalid" in refusal(gpu_memory_utilization=1.5)


def test_fp8_kv_cache_on_hybrid_model():
    message = refusal(kv_cache_dtype="fp8")
    assert "hybrid linear-attention model" in message and 'set kv_cache_dtype = "auto"' in message


def test_flag_the_pinned_vllm_does_not_accept():
    message = refusal(extra_engine_args=["--enable-reasoning"])
    assert "`--enable-reasoning` does not exist in vLLM 0.33.0" in message
    assert "--reasoning-parser NAME alone turns reasoning output on" in message


def test_flag_removed_in_v1_engine():
    assert "`--num-scheduler-steps` does not exist in vLLM 0.33.0" in refusal(
        extra_engine_args=["--num-scheduler-steps", "8"])


def test_made_up_flag():
    assert "`--turbo` is not a flag of vLLM 0.33.0" in refusal(extra_engine_args=["--turbo", "1"])


def test_known_flags_with_values_pass():
    [plan] = plan_hosts([("spark-a", host_data(extra_engine_args=["--max-num-batched-tokens", "8192"]))],
                        resolve=False)
    assert plan.engine_args[-2:] == ["--max-num-batched-tokens", "8192"]


def test_max_model_len_above_model_maximum():
    message = refusal(max_model_len=300000)
    assert "max_model_len=300000 exceeds" in message and "set max_model_len <= 262144" in message


def test_open_api_without_key():
    message = refusal(api_host="0.0.0.0")
    assert "no api_key" in message and "allow_unauthenticated_api = True" in message


def test_open_api_with_key_or_explicit_allowance():
    plan_hosts([("a", host_data(api_host="0.0.0.0", api_key="k"))], resolve=False)
    plan_hosts([("b", host_data(api_host="0.0.0.0", allow_unauthenticated_api=True))], resolve=False)


def test_unknown_vllm_version():
    assert "no flag table for vLLM 0.1.0" in refusal(vllm_version="0.1.0")


def test_every_bad_host_is_named_at_once():
    with pytest.raises(SettingsError) as caught:
        plan_hosts([("a", host_data(kv_cache_dtype="fp8")), ("b", host_data(api_port=0)), ("c", host_data())],
                   resolve=False)
    assert [p.split(":")[0] for p in caught.value.problems] == ["a", "b"]


def test_connection_keys_are_not_settings():
    parse_settings("a", {**DEFAULTS, "ssh_port": 2222, "ssh_key": "/k", "_sudo": True})


def test_defaults_have_one_home():
    """group_data/all.py holds every default; the model itself declares none."""
    assert set(DEFAULTS) == set(Settings.model_fields)
    assert all(field.is_required() for field in Settings.model_fields.values())


def test_defaults_apply_without_this_repository_group_data():
    s = parse_settings("spark-a", {"ssh_hostname": "spark-a.lan", "api_port": 9000})
    assert (s.model_repo, s.engine_image, s.model_root, s.api_port) == (
        "Qwen/Qwen3.5-35B-A3B-FP8", "vllm/vllm-openai:v0.33.0", "/var/lib/sparkfleet/models", 9000)
    assert s.limit_mm_per_prompt == {"image": 0, "video": 0} and s.extra_engine_args == []


def test_a_default_file_without_a_setting_names_it(tmp_path, monkeypatch):
    from sparkfleet.contract import settings

    partial = tmp_path / "all.py"
    partial.write_text("\n".join(f"{k} = {v!r}" for k, v in DEFAULTS.items() if k != "container_name"))
    monkeypatch.setattr(settings, "DEFAULTS_FILE", partial)
    settings.defaults.cache_clear()
    try:
        with pytest.raises(SettingsError) as caught:
            parse_settings("spark-a", {})
    finally:
        settings.defaults.cache_clear()
    assert caught.value.problems == [
        "spark-a: setting `container_name` is missing: set it in group_data/all.py"]
