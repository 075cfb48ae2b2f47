"""Hostile settings: `sparkfleet plan` refuses each with exit 2, before any host or hub is asked.

Every refusal is one line that names the host and the key; a secret's value
never appears, not in the output, not in repr(settings), not in pydantic's own
error text. Good values of the same kinds still plan, and land quoted.

The sweep goes through the planner with the host's data as the CLI's inventory load merges it
(`plan_settings`): that load (pyinfra's) costs ~0.25 s a case; a handful of cases go through
`cli.main` and print the same (test_the_cli_refuses_with_exit_2_and_the_same_line).
"""

import contextlib
import io
import re
import shlex

import pytest
from pydantic import ValidationError

from sparkfleet import cli
from sparkfleet.roles.guard import guard_plan
from sparkfleet.controller.inventory import load_hosts
from sparkfleet.release.plan import plan_hosts
from sparkfleet.release.render import systemd_quote
from sparkfleet.contract.settings import GROUPS_KEY, USER_SET_KEY, Settings, parse_settings
from sparkfleet.refused import Refusal

from .helpers import DEFAULTS, host_data

SECRET = "s3cret-Tok3n"


def inventory_data(data: dict) -> dict:
    """One host's data as load_hosts merges an entry `('spark-x', data)`: group_data/all.py under it, its keys
    named as set by the user, its groups the file's own (test_inventory_data_is_what_the_cli_loads holds it to
    that)."""
    return {**DEFAULTS, **data, USER_SET_KEY: sorted(data), GROUPS_KEY: ["sparks"]}


@pytest.fixture
def plan_cli(tmp_path, capsys, monkeypatch):
    """Run `sparkfleet plan` on a one-host inventory with `data`: (exit code, everything printed)."""
    monkeypatch.setattr("sparkfleet.controller.inventory.hub_resolver", lambda s: (None, None, "offline test: no hub is asked"))

    def run(**data):
        inventory = tmp_path / "fleet.py"
        inventory.write_text(f"sparks = [('spark-x', {data!r})]\n")
        code = cli.main(["plan", str(inventory)])
        printed = capsys.readouterr()
        return code, printed.out + printed.err

    return run


@pytest.fixture
def plan_settings():
    """`sparkfleet plan` without its inventory load: the planner on inventory_data(data), refusing through the
    CLI's own exit path; a refusal must come before the hub or the registry is asked. (exit code, printed)"""
    def run(**data):
        asked = []

        def hub(s):
            asked.append("hub")
            return None, None, "offline test: no hub is asked"

        def registry(s):
            asked.append("registry")
            return None, "offline test: no registry is asked"

        try:
            plan_hosts([("spark-x", inventory_data(data))], resolve=hub, resolve_image=registry)
        except Refusal as exc:  # what cli.main prints as a refusal
            assert not asked, f"the {asked} asked before the refusal"
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                code = cli.refuse(exc)
            return code, err.getvalue()
        return 0, f"planned; asked: {asked}"

    return run


def refused(plan, key: str, *reasons: str, **data) -> str:
    """Assert exit 2 and a line `spark-x: ... `key` ...` (saying one of `reasons`); return everything printed."""
    code, printed = plan(**data)
    assert code == 2, printed
    lines = [line for line in printed.splitlines() if f"`{key}" in line]
    assert lines, printed
    assert all(line.startswith("spark-x: ") for line in lines), lines
    assert not reasons or any(reason in line for reason in reasons for line in lines), printed
    return printed


def exec_argv(unit: str, directive: str) -> list[str]:
    """The argv systemd reads from the first `directive=` line (continuations joined, $$ and %% unescaped)."""
    text = unit.replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.startswith(f"{directive}="))
    return shlex.split(line.split("=", 1)[1].replace("$$", "$").replace("%%", "%"))


# --- image references --------------------------------------------------------

@pytest.mark.parametrize("image", [
    "vllm/vllm-openai:v0.33.0; touch /tmp/pwned",
    "vllm/vllm-openai:v0.33.0' || touch /tmp/pwned '",
    "$(touch /tmp/pwned)",
    "`reboot`",
    "--privileged",
    "vllm/vllm-openai:v0.33.0 --privileged",
    "vllm/VLLM-OpenAI:v0.33.0",
    "vllm/vllm-openai@sha256:abc123",
    "vllm/vllm-openai:v0.33.0#",
    "",
])
def test_image_reference_refused(plan_settings, image):
    refused(plan_settings, "engine_image", "must be a Docker image reference", engine_image=image)


@pytest.mark.parametrize("image", [
    "registry.lan:5000/vllm/vllm-openai:v0.33.0@sha256:" + "0123456789abcdef" * 4,
    "sparkfleet-registry:5000/vllm/vllm-openai:v0.33.0",
    "[fd00::5]:5000/vllm/vllm-openai:v0.33.0",
    "vllm/vllm-openai@sha256:" + "ab" * 32,
    "localhost/my_org/vllm__fork:2026.1-rc1",
])
def test_image_reference_accepted_and_quoted(image):
    [plan] = plan_hosts([("spark-a", host_data(engine_image=image))])
    unit = plan.render_unit()
    assert exec_argv(unit, "ExecStart")[:4] == ["/usr/bin/docker", "run", "--rm", "--name"]
    # a reference with a digest runs as name@digest (the tag says nothing more); a tag as written offline
    ref = re.sub(r":[^:/@]+@", "@", image)
    assert ref in exec_argv(unit, "ExecStart") and plan.engine_ref == ref
    # the pull runs the image as sh's $1: a script of constant text, then the image as one argument
    assert exec_argv(unit, "ExecStartPre")[0].endswith("sparkfleet-memcheck")
    pull = next(line for line in unit.splitlines() if "docker pull" in line)
    assert shlex.split(pull.split("=", 1)[1].replace("$$", "$")) == [
        "/bin/sh", "-c", 'docker image inspect "$1" >/dev/null 2>&1 || docker pull "$1"', "pull", ref]


# --- hosts ---------------------------------------------------------------------

@pytest.mark.parametrize("key", ["api_host", "lan_address"])
@pytest.mark.parametrize("value", [
    "127.0.0.1 #", "127.0.0.1#", "0.0.0.0; id", "spark a", "-oProxyCommand=id", "spark..lan", "$(id)", "",
    "a" * 64 + ".lan", "spark-.lan", "http://spark.lan",
])
def test_host_refused(plan_settings, key, value):
    refused(plan_settings, key, "must be an IP address or a host name", **{key: value, "api_key": SECRET})


@pytest.mark.parametrize("address", ["spark-a.lan", "10.0.0.9", "::1", "fd00::9", "localhost"])
def test_host_accepted(address):
    [plan] = plan_hosts([("spark-a", host_data(api_host=address, lan_address=address, api_key=SECRET))])
    bind = f"[{address}]:8000" if ":" in address else f"{address}:8000"  # the host's guard answers there
    assert f"    bind {bind}\n" in guard_plan(plan).config() and plan.lan_address == address


# --- paths ---------------------------------------------------------------------

@pytest.mark.parametrize("key", ["model_root", "controller_model_dir", "engine_image_archive"])
@pytest.mark.parametrize("path", [
    "relative/models",
    "/var/lib/../../etc",
    "/var/lib/sparkfleet/models/",
    "/var//lib/models",
    "//var/lib/models",
    "/",
    "/var/lib/$(id)",
    "/var/lib/a;b",
    "/var/lib/50%",
    "/var/lib/x:y",
    "/var/lib/'quoted'",
    "/var/lib/models /etc",
    "/var/lib/models\nProtectSystem=no",
])
def test_path_refused(plan_settings, key, path):
    refused(plan_settings, key, "must be an absolute, normalised path", "control character", **{key: path})


def test_path_with_a_space_is_one_argument_everywhere_in_the_units():
    [plan] = plan_hosts([("spark-a", host_data(model_root="/srv/spark models"))])
    assert plan.model_dir.startswith("/srv/spark models/Qwen--Qwen3.5-35B-A3B-FP8@")
    argv = exec_argv(plan.render_unit(), "ExecStart")
    assert f"{plan.model_dir}:{plan.model_dir}:ro" in argv
    assert argv[argv.index("vllm/vllm-openai:v0.33.0") + 1] == plan.model_dir
    share = plan.render_share_unit()
    share_argv = exec_argv(share, "ExecStart")
    assert share_argv[share_argv.index("--root") + 1] == "/srv/spark models"
    assert shlex.split(next(line for line in share.splitlines() if line.startswith("ReadOnlyPaths="))
                       .split("=", 1)[1]) == ["/srv/spark models"]


# --- URLs ------------------------------------------------------------------------

URL_KEYS = ["hub_endpoint", "controller_hub_endpoint", "controller_registry_url", "toolkit_key_url", "toolkit_repo_url", "controller_api_url"]


@pytest.mark.parametrize("key", URL_KEYS)
@pytest.mark.parametrize("url", [
    "ftp://mirror.lan/pub",
    "file:///etc/passwd",
    "mirror.lan/pub",
    "http://mirror.lan/stable\ndeb [trusted=yes] http://evil.lan/ /",
    "http://user:password@mirror.lan/pub",
    "http://mirror.lan/pub extra",
    "http://mirror.lan/$(id)",
    "http://mirror.lan/pub?x=1",
    "http://mirror.lan/pub#frag",
    "http://mirror.lan:99999/",
    "http://mir ror.lan/",
    "http://mirror.lan/{os}",
])
def test_url_refused(plan_settings, key, url):
    refused(plan_settings, key, "must be an http(s) URL", "control character", **{key: url})


def test_only_the_toolkit_repo_url_takes_arch(plan_settings):
    refused(plan_settings, "hub_endpoint", "must be an http(s) URL", hub_endpoint="http://mirror.lan/{arch}")
    s = parse_settings("spark-a", host_data(toolkit_repo_url="https://mirror.lan:8443/libnvidia-container/deb/{arch}"))
    assert s.toolkit_repo_url.format(arch="arm64") == "https://mirror.lan:8443/libnvidia-container/deb/arm64"


@pytest.mark.parametrize("url", ["http://10.0.0.5:8080", "https://hub.lan/mirror/", "http://[fd00::1]:8080/hub"])
def test_url_accepted(url):
    s = parse_settings("spark-a", host_data(hub_endpoint=url, controller_api_url=url, toolkit_key_url=url))
    assert (s.hub_endpoint, s.controller_api_url, s.toolkit_key_url) == (url, url, url)


# --- environment variable names -------------------------------------------------------

@pytest.mark.parametrize("name", ["A;B", "lower_case", "1ABC", "A B", "A=B", "A\nB", "", "$(id)"])
def test_engine_env_name_refused(plan_settings, name):
    refused(plan_settings, "engine_env", "(key)` is invalid", engine_env={name: "1"})


def test_engine_env_cannot_replace_the_api_key(plan_settings):
    printed = refused(plan_settings, "api_key", "engine_env sets VLLM_API_KEY", engine_env={"VLLM_API_KEY": SECRET})
    assert SECRET not in printed


def test_engine_env_that_opens_the_admin_surface_exits_2(plan_settings):
    refused(plan_settings, "engine_env['VLLM_SERVER_DEV_MODE'] (key)", "opens vLLM's development endpoints",
            engine_env={"VLLM_SERVER_DEV_MODE": "1"})


def test_ssh_hostname_with_a_newline_exits_2(plan_settings):
    refused(plan_settings, "ssh_hostname", "contains the control character U+000A",
            ssh_hostname="10.0.0.9:8000\n    server evil 203.0.113.7:80")


def test_trust_remote_code_exits_2(plan_settings):
    refused(plan_settings, "extra_engine_args", "`--trust-remote-code` runs the model repository's Python as root",
            extra_engine_args=["--trust-remote-code"])


def test_engine_env_accepted():
    [plan] = plan_hosts([("spark-a", host_data(engine_env={"VLLM_LOGGING_LEVEL": "DEBUG", "TZ": "Europe/Berlin"}))])
    assert plan.render_engine_env().splitlines()[1:] == ["TZ=Europe/Berlin", "VLLM_LOGGING_LEVEL=DEBUG"]


# --- other names: container, network, parsers, served name, repository, versions ------------------

@pytest.mark.parametrize("key,value", [
    ("container_name", "vllm; id"),
    ("container_name", "-vllm"),
    ("docker_network", "host --privileged"),
    ("docker_network", "container:other"),
    ("served_model_name", "Qwen %n"),
    ("served_model_name", "Qwen $HOME"),
    ("tool_call_parser", "qwen3_coder --api-key x"),
    ("reasoning_parser", "qwen3'"),
    ("attention_backend", "FLASH ATTN"),
    ("kv_cache_dtype", "auto;"),
    ("expected_arch", "aarch64 x86_64"),
    ("model_repo", "../../etc"),
    ("model_repo", "Qwen/Qwen3.5/../../x"),
    ("model_revision", "../../../etc"),
    ("model_revision", "main; id"),
    ("vllm_version", "../../../etc/passwd"),
    ("sglang_version", "0.5; id"),
    ("llamacpp_version", "b7000 --api-key x"),
    ("min_driver_version", "580 || true"),
    ("toolkit_version", "1.18.1-1 nvidia-ctk"),
    ("toolkit_key_fingerprint", "C95B321B61E88C1809C4F759DDCAE044F796ECB"),
])
def test_name_refused(plan_settings, key, value):
    refused(plan_settings, key, f"`{key}` = {value!r} is invalid: must be", **{key: value})


@pytest.mark.parametrize("value", ["../x.gguf", "/etc/passwd", "a b.gguf", "*.gguf;id", "x\n.gguf"])
def test_model_files_glob_refused(plan_settings, value):
    refused(plan_settings, "model_files", "`model_files[0]` is invalid", model_files=[value])


def test_engine_refused(plan_settings):
    refused(plan_settings, "engine", "`engine` = 'tgi' is invalid", engine="tgi")


def test_limit_mm_per_prompt_key_refused(plan_settings):
    refused(plan_settings, "limit_mm_per_prompt", "(key)` is invalid", limit_mm_per_prompt={"image; id": 0})


# --- control characters in every string setting -------------------------------------------

# Every string-valued setting, with a good value to break (None-defaulted ones need one).
STRING_SETTINGS = {
    **{key: value for key, value in DEFAULTS.items() if isinstance(value, str)},
    "hub_endpoint": "http://hub.lan:8080", "controller_hub_endpoint": "http://127.0.0.1:8080",
    "controller_registry_url": "http://127.0.0.1:5000",
    "hub_token": SECRET, "lan_address": "spark-a.lan", "controller_model_dir": "/srv/models",
    "engine_image_archive": "/srv/vllm.tar", "api_key": SECRET, "controller_api_url": "http://127.0.0.1:8000",
    "controller_front_door_url": "http://127.0.0.1:8080", "front_door_tls_cert": "/srv/tls/door.pem",
    "front_door_tls_key": "/srv/tls/door.key", "controller_front_door_ca": "/srv/tls/ca.pem",
    "fleet_ca_cert": "/srv/tls/fleet.ca.crt", "fleet_ca_key": "/srv/tls/fleet.ca.key",
    "speculative_method": "mtp", "fabric_address": "192.168.100.1",
    "alertmanager_webhook_url": "http://alerts.lan:9000/hook", "front_door_address": "10.0.0.100/24",
    "quality_probes": "probes/office.toml", "backup_repository": "sftp:backup@nas.lan:/srv/restic",
    "controller_backup_password_file": "/srv/keys/office.backup-password",
}
ITEM_SETTINGS = {"extra_engine_args", "model_files", "engine_env", "limit_mm_per_prompt", "front_door_users", "front_door_viewers",
                 "services",
                 "tensor_parallel_hosts", "ray_start_args", "refused_kernels", "refused_pair_kernels",
                 "refused_drivers", "platform_pins"}


def test_the_sweep_covers_every_string_setting():
    typed_str = {name for name, field in Settings.model_fields.items()
                 if "str" in repr(field.annotation) or "Literal" in repr(field.annotation)}
    assert typed_str - ITEM_SETTINGS == set(STRING_SETTINGS)


@pytest.mark.parametrize("key", sorted(STRING_SETTINGS))
@pytest.mark.parametrize("char", ["\n", "\r", "\x00", "\x1b", "\u2028"])
def test_control_character_refused(plan_settings, key, char):
    value = STRING_SETTINGS[key] + char + "ExecStartPre=/bin/id"
    printed = refused(plan_settings, key, **{key: value})
    assert not any(line.startswith("ExecStartPre") for line in printed.splitlines())  # escaped, if shown at all
    assert len([line for line in printed.splitlines() if f"`{key}`" in line]) == 1
    assert SECRET not in printed


@pytest.mark.parametrize("key,value,named", [
    ("extra_engine_args", ["--max-num-seqs", "4\nExecStartPre=/bin/id"], "extra_engine_args[1]"),
    ("extra_engine_args", ["--enforce-eager\r"], "extra_engine_args[0]"),
    ("engine_env", {"VLLM_LOGGING_LEVEL": "INFO\nEXTRA=1"}, "engine_env['VLLM_LOGGING_LEVEL']"),
    ("engine_env", {"A\x00": "1"}, "engine_env['A\\x00'] (key)"),
    ("limit_mm_per_prompt", {"image\n": 0}, "limit_mm_per_prompt['image\\n'] (key)"),
    ("ray_start_args", ["--num-cpus", "1\nExecStartPre=/bin/id"], "ray_start_args[1]"),
    ("tensor_parallel_hosts", ["spark-x", "spark-y\nExecStartPre=/bin/id"], "tensor_parallel_hosts[1]"),
    ("refused_drivers", {"580.*": "slow\nExecStartPre=/bin/id"}, "refused_drivers['580.*']"),
    ("refused_kernels", {"6.17\x00": "why"}, "refused_kernels['6.17\\x00'] (key)"),
])
def test_control_character_in_items_refused(plan_settings, key, value, named):
    printed = refused(plan_settings, key, f"`{named}` is invalid", **{key: value})
    assert "ExecStartPre=/bin/id" not in printed


# --- secrets are never echoed ------------------------------------------------------------------

@pytest.mark.parametrize("data,key", [
    ({"api_key": SECRET + "\n"}, "api_key"),
    ({"api_key": SECRET + " with space"}, "api_key"),
    ({"api_key": [SECRET]}, "api_key"),
    ({"hub_token": SECRET + "\r"}, "hub_token"),
    ({"hub_token": {"t": SECRET}}, "hub_token"),
    ({"engine_env": {"HF_TOKEN": SECRET + "\n"}}, "engine_env"),
    ({"engine_env": {"A;B": SECRET}}, "engine_env"),
    ({"engine_env": SECRET}, "engine_env"),
    ({"api_kye": SECRET}, "api_kye"),
    ({"front_door_users": {"alice": SECRET + "-long-enough\n"}}, "front_door_users"),
])
def test_secret_never_echoed(plan_settings, data, key):
    printed = refused(plan_settings, key, **data)
    assert SECRET not in printed


def test_secrets_stay_out_of_repr_and_pydantic_errors():
    s = parse_settings("spark-a", host_data(api_key=SECRET, hub_token=SECRET + "h", engine_env={"E": SECRET + "e"}))
    assert SECRET not in repr(s) and SECRET not in str(s)
    with pytest.raises(ValidationError) as caught:
        Settings(**{**DEFAULTS, "api_key": SECRET + "\n", "hub_token": [SECRET], "engine_env": {"A": SECRET + "\0"}})
    assert SECRET not in str(caught.value)


# --- secret-bearing and sparkfleet-owned flags in extra_engine_args -------------------------------

@pytest.mark.parametrize("args,fix", [
    (["--api-key", SECRET], "set the `api_key` setting instead"),
    ([f"--api-key={SECRET}"], "set the `api_key` setting instead"),
    (["--api_key", SECRET], "set the `api_key` setting instead"),
    (["--max-num-batched-tokens", "8192", "--api-key", SECRET, "other"], "set the `api_key` setting instead"),
    (["--hf-token", SECRET], "`hub_token`"),
])
def test_secret_flag_refused(plan_settings, args, fix):
    printed = refused(plan_settings, "extra_engine_args", "would put a secret in the world-readable unit",
                      extra_engine_args=args)
    assert fix in printed and SECRET not in printed


@pytest.mark.parametrize("args,owner", [
    (["--port", "9000"], "api_port"),
    (["--host=0.0.0.0"], "api_host"),
    (["--served-model-name", "other"], "served_model_name"),
    (["-tp", "2"], "tensor_parallel_size"),
    (["--no-enable-prefix-caching"], "enable_prefix_caching"),
    (["--max-model-len", "1048576"], "max_model_len"),
])
def test_flag_owned_by_a_setting_refused(plan_settings, args, owner):
    refused(plan_settings, "extra_engine_args", f"is set by sparkfleet from `{owner}`: set `{owner}` instead",
            extra_engine_args=args)


# --- the unit's own quoting -----------------------------------------------------------------------

@pytest.mark.parametrize("value", ["a\nb", "a\rb", "a\x00b", "a\u2028b"])
def test_systemd_quote_refuses_what_it_cannot_quote(value):
    with pytest.raises(ValueError, match="control character"):
        systemd_quote(value)


def test_systemd_quote_keeps_one_argument():
    value = "/srv/my models/it's \"quoted\" $HOME 50% \\x"
    quoted = systemd_quote(value)
    assert quoted == '"/srv/my models/it\'s \\"quoted\\" $$HOME 50%% \\\\x"'
    assert shlex.split(quoted.replace("$$", "$").replace("%%", "%")) == [value]


# --- the watchdog, the front door and the GPU: numbers in range, choices from their list ----------------

@pytest.mark.parametrize("key,value", [
    ("watchdog_interval_s", 0), ("watchdog_interval_s", "30; reboot"), ("watchdog_failures", 0),
    ("watchdog_max_restarts", 101), ("watchdog_window_s", 59), ("drain_timeout_s", -1),
    ("front_door_port", 70000), ("gpu_device_mode", "cdi; reboot"), ("watchdog", "sometimes"),
    ("min_toolkit_version", "1.18\n; reboot"), ("front_door_tls_cert", "relative/cert.pem"),
    ("controller_front_door_url", "ftp://door.lan"),
    ("rollout_max_regression", 1), ("rollout_max_regression", -0.1), ("rollout_max_regression", "0.1; reboot"),
    ("rollout_max_regression", float("nan")),
])
def test_service_settings_out_of_range_refused(plan_settings, key, value):
    refused(plan_settings, key, "is invalid", **{key: value})


# --- the CLI: the same refusals through `cli.main` and pyinfra's inventory load -------------------------

@pytest.mark.parametrize("key,data", [
    ("engine_image", {"engine_image": "$(touch /tmp/pwned)"}),
    ("api_host", {"api_host": "0.0.0.0; id", "api_key": SECRET}),
    ("model_root", {"model_root": "/var/lib/models\nProtectSystem=no"}),
    ("hub_token", {"hub_token": SECRET + "\r"}),
    ("api_kye", {"api_kye": SECRET}),
    ("ssh_hostname", {"ssh_hostname": "10.0.0.9:8000\n    server evil 203.0.113.7:80"}),
    ("engine_env['VLLM_SERVER_DEV_MODE'] (key)", {"engine_env": {"VLLM_SERVER_DEV_MODE": "1"}}),
    ("extra_engine_args", {"extra_engine_args": ["--api-key", SECRET]}),
])
def test_the_cli_refuses_with_exit_2_and_the_same_line(plan_cli, plan_settings, key, data):
    printed = refused(plan_cli, key, **data)
    assert len([line for line in printed.splitlines() if f"`{key}" in line]) == 1 and SECRET not in printed
    assert printed == plan_settings(**data)[1]


@pytest.mark.parametrize("data", [
    {}, {"engine_image": "--privileged", "api_key": SECRET},
    {"model_root": "/srv/models", "engine_env": {"A": "1"}, "extra_engine_args": ["--enforce-eager"]},
])
def test_inventory_data_is_what_the_cli_loads(tmp_path, data):
    inventory = tmp_path / "fleet.py"
    inventory.write_text(f"sparks = [('spark-x', {data!r})]\n")
    assert load_hosts(str(inventory)) == [("spark-x", inventory_data(data))]
