"""Hostile values in the smaller places (issue 19, item 8), each with the hostile input that opened its hole.

ssh_hostname as the LAN address; engine-, hub- and host-controlled strings printed as rich markup; a hub's
config.json numbers; a rollback's engine environment; a secret staged under `_sudo`; the hub token of a
controller copy.
"""

import pytest

from sparkfleet.roles.front_door.plan import front_door_plan
from sparkfleet.release.plan import plan_hosts
from sparkfleet.contract.settings import SettingsError, parse_settings

from .helpers import host_data

# --- ssh_hostname: the LAN address a peer URL, the front door and status build on ----------------------------

INJECTED = "10.0.0.9:8000 check\n    server evil 203.0.113.7:80"


@pytest.mark.parametrize("hostname", [INJECTED, "10.0.0.9\n", "spark a", "spark;id", "[fd00::9]", "", 10])
def test_hostile_ssh_hostname_is_refused_before_any_config_is_rendered(hostname):
    hosts = [(name, host_data(ssh_hostname=hostname if name == "spark-2" else "10.0.0.8", api_host="0.0.0.0",
                              api_key="k" * 16, front_door_users={"alice": "a" * 16}))
             for name in ("spark-1", "spark-2")]
    with pytest.raises(SettingsError) as caught:
        plans = {p.name: p for p in plan_hosts(hosts)}
        front_door_plan("spark-1", plans).config()  # never reached: the plan is refused first
    [line] = caught.value.problems
    assert line.startswith(f"spark-2: `ssh_hostname` = {hostname!r} is invalid: ") and "fix it in the inventory" in line


def test_status_refuses_it_too():
    with pytest.raises(SettingsError, match=r"^spark-2: `ssh_hostname` = .* is invalid: contains the control character"):
        parse_settings("spark-2", host_data(ssh_hostname=INJECTED))


@pytest.mark.parametrize("hostname", ["spark-1.lan", "10.0.0.9", "fd00::9", "localhost"])
def test_ordinary_ssh_hostnames_plan_and_become_the_lan_address(hostname):
    [plan] = plan_hosts([("spark-1", host_data(ssh_hostname=hostname))])
    assert plan.lan_address == hostname


# --- strings from an engine, a hub or a host are text, never rich markup -------------------------------------

MODEL_ID = "[/]"
REPLY = "[/INST] [bold]x"


@pytest.fixture
def inventory(tmp_path):
    path = tmp_path / "fleet.py"
    path.write_text("sparks = [('spark-x', {'ssh_hostname': '10.0.0.9', 'api_host': '0.0.0.0', "
                    "'api_key': 'k' * 16})]\n")
    return str(path)


def test_status_prints_a_hostile_model_id_reply_and_host_facts_literally(inventory, monkeypatch, capsys):
    from sparkfleet import cli, tables
    from sparkfleet.fleet import converge, status
    from sparkfleet.fleet.front_door import commands as fd_commands

    monkeypatch.setattr(tables, "CI_WIDTH", 1000)  # no cell wraps
    monkeypatch.setattr(tables, "LOG_WIDTH", 1000)  # and status's log gets the wide table, every cell in it
    facts = {"driver": "[red]580", "cuda": "13.0", "toolkit": "[/]", "release_id": "[link=x]r", "model_verified": True,
             "unit_active": True, "services": {"embed": {"kind": "embedding", "port": "[/]", "serving": False,
                                                          "detail": "[/] engine said no"}},
             "watchdog": {"last_probe_s_ago": 3, "last_result": "[/]", "consecutive_failures": "[b]0",
                          "restarts_in_window": 0, "gave_up": False, "gpu_visible": True}}
    row = {"host": "spark-x", "url": "http://10.0.0.9:8000", "healthy": True, "served": [MODEL_ID, "[bold]m"],
           "metrics": {}, "error": "[/] hub error", "chat": REPLY, "ssh": facts}
    monkeypatch.setattr(converge, "read_hosts", lambda inv, names, fact: {n: facts for n in names})
    monkeypatch.setattr(status, "host_row", lambda *a, **k: row)
    monkeypatch.setattr(fd_commands, "front_door_status", lambda inv: None)
    assert cli.main(["status", inventory, "--chat"]) == 0
    out = capsys.readouterr().out
    for text in (f"spark-x answers: {REPLY}", f"{MODEL_ID}, [bold]m", "[/] hub error", "[red]580", "[link=x]r",
                 "embed:[/] NOT answering ([/] engine said no)", "[/] 3 s ago, [b]0 failing"):
        assert text in out, (text, out)


def test_plan_prints_a_hostile_hub_error_literally(inventory, monkeypatch, capsys):
    from sparkfleet import cli

    monkeypatch.setattr("sparkfleet.controller.inventory.hub_resolver", lambda s: (None, None, "[/] the hub said [bold]no"))
    assert cli.main(["plan", inventory]) == 0
    assert "hub unreachable: [/] the hub said [bold]no" in capsys.readouterr().out


def test_rollout_report_prints_a_hostile_detail_literally(capsys):
    from sparkfleet.commands import common
    from sparkfleet.fleet.rollout import HostReport

    common.print_reports([HostReport("spark-x", "a" * 12, "b" * 12, "failed", 1.0, "[/] gate: [bold]x")], False)
    assert "[/] gate: [bold]x" in capsys.readouterr().err


def test_bench_prints_a_hostile_model_and_error_literally(capsys):
    from sparkfleet.fleet import bench

    spread = {"p50": 1.0, "p90": 1.0, "p99": 1.0}
    level = {"concurrency": 1, "requests": 1, "errors": 1, "ttft_ms": spread, "tpot_ms": spread, "itl_ms": spread,
             "request_tokens_per_s": spread, "aggregate_tokens_per_s": 1.0, "error_messages": ["[/] HTTP 500"]}
    bench.print_table({"model": MODEL_ID, "url": "http://10.0.0.9:8000", "max_tokens": 8, "think": False,
                       "levels": [level], "single_stream_decode_tokens_per_s": 1.0, "roofline_tokens_per_s": None,
                       "prefix_cache": {"before": None, "after": None}})
    out = capsys.readouterr().out
    assert f"sparkfleet bench: {MODEL_ID} at" in out and "concurrency 1: [/] HTTP 500" in out


# --- a hub's config.json numbers ------------------------------------------------------------------------------

REPO = "Qwen/Qwen3.5-35B-A3B-FP8"


def resolver_with(config):
    """A resolver answering the default model as the hub lists it, with this config.json (parsed as the hub
    client's json.loads does: NaN and Infinity become floats)."""
    from sparkfleet.model.manifest import Manifest, ManifestFile

    files = tuple(ManifestFile(f"model-{i:05d}-of-00014.safetensors", 2_500_000_000, sha256=f"{i:064x}")
                  for i in range(1, 15)) + (ManifestFile("config.json", 4000, blob_sha1="c" * 40),)
    manifest = Manifest("modelscope", REPO, "master", "f" * 40, files)
    return lambda settings: (manifest, config, None)


def hostile_config(path: str, value):
    import copy
    import json

    from sparkfleet.contract.recipes import known_model

    config = copy.deepcopy(known_model(REPO).config)
    *parents, key = path.split(".")
    table = config
    for parent in parents:
        table = table[parent]
    table[key] = value
    return json.loads(json.dumps(config))  # NaN/Infinity round-trip as the hub's bytes would


@pytest.mark.parametrize("path,value,shown", [
    ("text_config.num_attention_heads", 0, "`num_attention_heads` = 0 is not a positive integer"),
    ("text_config.num_key_value_heads", float("nan"), "`num_key_value_heads` = nan is not a positive integer"),
    ("text_config.hidden_size", float("inf"), "`hidden_size` = inf is not a positive integer"),
    ("text_config.max_position_embeddings", -262144, "`max_position_embeddings` = -262144 is not"),
    ("text_config.num_hidden_layers", 40.5, "`num_hidden_layers` = 40.5 is not a positive integer"),
    ("text_config.num_hidden_layers", 10**12, "`num_hidden_layers` = 1000000000000 is not a positive integer"),
    ("text_config.head_dim", "256", "`head_dim` = '256' is not a positive integer"),
    ("text_config.moe_intermediate_size", -512, "`moe_intermediate_size` = -512 is not"),
    ("text_config.num_experts", float("-inf"), "`num_experts` = -inf is not an integer >= 0"),
    ("text_config.mtp_num_hidden_layers", -1, "`mtp_num_hidden_layers` = -1 is not an integer >= 0"),
    ("text_config.vocab_size", True, "`vocab_size` = True is not a positive integer"),
    ("text_config.layer_types", "full_attention", "`layer_types` is not a list of names"),
    ("text_config", [1], "`text_config` is not an object"),
    ("text_config", None, "lacks `num_hidden_layers`, `num_attention_heads`"),
    ("text_config.max_position_embeddings", None, "lacks `max_position_embeddings`"),
])
def test_hostile_config_numbers_are_refused_with_the_key_and_the_repo(path, value, shown):
    with pytest.raises(SettingsError) as caught:
        plan_hosts([("spark-x", host_data())], resolve=resolver_with(hostile_config(path, value)))
    [line] = [p for p in caught.value.problems if "config.json" in p]
    assert line.startswith(f"spark-x: config.json of {REPO}") and shown in line, line
    assert "check model_repo and model_revision" in line


def test_a_config_that_is_not_an_object_is_refused():
    with pytest.raises(SettingsError, match=rf"spark-x: config.json of {REPO} is not a JSON object"):
        plan_hosts([("spark-x", host_data())], resolve=resolver_with(["not", "an", "object"]))


def test_a_config_lacking_a_key_the_fit_needs_is_refused_not_raised():
    with pytest.raises(SettingsError, match=r"spark-x: config.json lacks 'vocab_size': cannot plan the fit"):
        plan_hosts([("spark-x", host_data())], resolve=resolver_with(hostile_config("text_config.vocab_size", None)))


def test_the_cli_exits_2_on_a_hostile_config(inventory, monkeypatch, capsys):
    from sparkfleet import cli

    monkeypatch.setattr("sparkfleet.controller.inventory.hub_resolver", resolver_with(hostile_config("text_config.num_attention_heads", 0)))
    assert cli.main(["plan", inventory]) == 2
    assert "`num_attention_heads` = 0 is not a positive integer" in capsys.readouterr().err


def test_a_service_config_is_checked_too():
    from sparkfleet.model.manifest import Manifest, ManifestFile
    from sparkfleet.contract.recipes import known_model

    def resolve(s):
        facts = known_model(s.model_repo)
        manifest = Manifest("modelscope", s.model_repo, "master", "f" * 40,
                            (ManifestFile("model.safetensors", facts.weight_bytes, sha256="a" * 64),))
        config = dict(facts.config)
        if s.model_repo != REPO:
            config["num_attention_heads"] = float("nan")
        return manifest, config, None

    with pytest.raises(SettingsError) as caught:
        plan_hosts([("spark-x", host_data(services={"embed": {"recipe": "qwen3-embedding-0.6b"}}))], resolve=resolve)
    assert any(p.startswith("spark-x: service 'embed': config.json of ") and "`num_attention_heads` = nan" in p
               for p in caught.value.problems), caught.value.problems


def test_the_catalogue_configs_pass():
    from sparkfleet.model.config import config_problem
    from sparkfleet.contract.recipes import catalogue

    assert {name: config_problem(r.model.config, r.model.repo) for name, r in catalogue().items()
            if r.model.config} == {name: None for name, r in catalogue().items() if r.model.config}


# --- a rollback never restores an older engine_env (a secret setting) -------------------------------------------

HEADER = "# Managed by sparkfleet. Root-only: read by `docker run --env-file`.\n"
FABRIC = "VLLM_HOST_IP=192.168.100.2\nNCCL_SOCKET_IFNAME=enp1s0f0np0\n"
OLD_ENV = HEADER + "VLLM_API_KEY=old-key-0000000000\nHF_TOKEN=old-leaked-token\nSIM_DELAY=a=b c\n" + FABRIC
NEW_ENV = HEADER + "VLLM_API_KEY=rotated-key-1111111\nHF_TOKEN=rotated-token\nSIM_FAIL_HEALTH=1\n"


def run_sh(command: str) -> None:
    import subprocess

    subprocess.run(["sh", "-c", command], check=True)


def env_edit(action: str, live, kept) -> str:
    """The rollback's command for the engine env, run with the real host module on these files."""
    from sparkfleet.contract.shared import PACKAGE_DIR
    from sparkfleet.host.operations import env_command

    return env_command(action, str(live), str(kept), module=str(PACKAGE_DIR))


def test_a_rollback_takes_todays_secrets_and_never_an_older_engine_env_value(tmp_path):
    live, kept = tmp_path / "engine.env", tmp_path / "previous.env"
    live.write_text(OLD_ENV)  # the running release (a group member) is replaced by a single-host one
    run_sh(env_edit("env-keep", live, kept))
    assert kept.read_text() == "#key HF_TOKEN\n#key SIM_DELAY\n" + FABRIC  # names, never values
    assert oct(kept.stat().st_mode & 0o777) == "0o600"
    live.write_text(NEW_ENV)  # the new release, after the user rotated the key and the token
    run_sh(env_edit("env-restore", live, kept))
    # today's key and token; SIM_FAIL_HEALTH came with the release rolled back; SIM_DELAY is gone from today's
    # inventory, so its older value stays gone
    assert live.read_text() == HEADER + "VLLM_API_KEY=rotated-key-1111111\nHF_TOKEN=rotated-token\n" + FABRIC
    assert oct(live.stat().st_mode & 0o777) == "0o600"
    assert "old-" not in live.read_text() + kept.read_text()
    assert kept.read_text() == "#key HF_TOKEN\n#key SIM_FAIL_HEALTH\n"  # the release rolled back, for a second


def test_a_kept_env_written_by_the_older_rule_gives_back_names_and_fabric_never_values(tmp_path):
    live, kept = tmp_path / "engine.env", tmp_path / "previous.env"
    live.write_text(NEW_ENV)
    kept.write_text(OLD_ENV.replace("VLLM_API_KEY=old-key-0000000000\n", ""))  # the older rule kept all but the key
    run_sh(env_edit("env-restore", live, kept))
    assert live.read_text() == HEADER + "VLLM_API_KEY=rotated-key-1111111\nHF_TOKEN=rotated-token\n" + FABRIC


def test_an_empty_kept_env_restores_todays_key_alone(tmp_path):
    live, kept = tmp_path / "engine.env", tmp_path / "previous.env"
    live.write_text(NEW_ENV)
    kept.write_text("")
    run_sh(env_edit("env-restore", live, kept))
    assert live.read_text() == HEADER + "VLLM_API_KEY=rotated-key-1111111\n"


# --- secret_file under _sudo: no predictable, world-readable staging file ---------------------------------------

ENV = "/etc/sparkfleet/engine.env"
SECRET = "VLLM_API_KEY=sk-rotated-4242\n"


def secret_commands(**escalation):
    """The command objects secret_file yields on a host whose engine env is absent, under these arguments."""
    import functools

    from pyinfra.api.host import Host
    from pyinfra.context import ctx_host, ctx_state
    from pyinfra_testing.util import FakeState, create_host

    from sparkfleet.host.operations import secret_file

    host = create_host(FakeState(), facts={"state.HostState": {"files": {}, "units": {}}})
    host.current_op_global_arguments = {"name": "Engine environment (root-only)", **escalation}
    host._get_temp_directory = lambda: "/tmp"  # pyinfra's own temp names, not the fake host's fixed one
    host.get_temp_filename = functools.partial(Host.get_temp_filename, host)
    with ctx_state.use(host.state), ctx_host.use(host):
        return list(secret_file._inner(ENV, SECRET)), host.get_temp_filename(f"{ENV}.sparkfleet-new")


def text(command) -> str:
    return command.get_raw_value() if hasattr(command, "get_raw_value") else repr(command)


@pytest.mark.parametrize("escalation", [{"_sudo": True}, {"_sudo": True, "_sudo_user": "root"}, {"_doas": True},
                                        {"_su_user": "root"}])
def test_under_escalation_the_secret_waits_in_a_private_directory_of_an_unpredictable_name(escalation):
    from pyinfra.api.command import FileUploadCommand

    commands, predictable = secret_commands(**escalation)
    upload = next(c for c in commands if isinstance(c, FileUploadCommand))
    private = upload.remote_temp_filename.rsplit("/", 1)[0]
    assert upload.remote_temp_filename != predictable and private.startswith("/tmp/pyinfra-")
    made, removed = commands[commands.index(upload) - 1], commands[commands.index(upload) + 1]
    assert text(made) == f"( umask 077 && mkdir {private} )"  # 0700, and no -p: an existing path fails
    assert text(removed) == f"rm -rf {private}"
    for command in (made, removed):  # the login user's, as the SFTP upload is: not root's
        assert command.connector_arguments == {"_sudo": False, "_doas": False, "_dzdo": False, "_su_user": None}
    assert text(commands[-1]) == f"mv -f {ENV}.sparkfleet-new {ENV}"
    again = next(c for c in secret_commands(**escalation)[0] if isinstance(c, FileUploadCommand))
    assert again.remote_temp_filename != upload.remote_temp_filename
    assert not any("sk-rotated" in text(c) for c in commands)


def test_without_escalation_the_bytes_go_straight_into_the_0600_staged_file():
    commands, _ = secret_commands()
    assert [text(c) for c in commands][1:] == [f"FileUploadCommand({commands[1].src}, {ENV}.sparkfleet-new)",
                                               f"mv -f {ENV}.sparkfleet-new {ENV}"]
    assert commands[1].remote_temp_filename is None


def test_escalating_to_another_user_is_refused_with_the_fix():
    from pyinfra.api import OperationValueError

    with pytest.raises(OperationValueError, match=r"cannot hand a secret to 'vllm' .*connect as root"):
        secret_commands(_sudo=True, _sudo_user="vllm")


# --- model_source = "controller": the controller's copy of a gated model needs hub_token ------------------------

HUB_TOKEN = "hf_gated0123456789abcdef"


@pytest.fixture
def gated_hub(tmp_path, monkeypatch):
    """The sim's hub on 127.0.0.1 answering only requests that carry HUB_TOKEN (a gated model)."""
    import threading

    from sim.hub import server as hub_server
    from sim.hub.model import generate

    from tests.conftest import MODEL_REPO

    generate(MODEL_REPO, tmp_path / "hub" / MODEL_REPO, shards=2, shard_mb=0.25)
    server = hub_server.make_server(tmp_path / "hub", log=False)

    class Gated(server.RequestHandlerClass):
        def _dispatch(self):
            if self.headers.get("Authorization") != f"Bearer {HUB_TOKEN}":
                self._responded = False
                return self._hf_error(401, "GatedRepo", "Access to this model is restricted: log in")
            return super()._dispatch()

    server.RequestHandlerClass = Gated
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    for name in ("HF_TOKEN", "MODELSCOPE_API_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    try:
        yield hub_server.server_url(server)
    finally:
        server.shutdown()
        server.server_close()


def test_the_controller_copies_a_gated_model_with_hub_token_and_never_writes_it_down(gated_hub, tmp_path):
    from sparkfleet.controller.copy import ControllerCopyError, controller_copy
    from sparkfleet.model.hubs import hub_resolver

    data = host_data(model_hub="huggingface", model_revision="main", hub_endpoint=gated_hub, hub_token=HUB_TOKEN,
                     model_source="controller", controller_model_dir=str(tmp_path / "copy"),
                     model_root=str(tmp_path / "models"))
    [plan] = plan_hosts([("spark-x", data)], resolve=hub_resolver)
    s = plan.settings
    with pytest.raises(ControllerCopyError, match="cannot fetch it"):  # what today's main did: no token
        controller_copy(plan.manifest, s.controller_model_dir, s.controller_endpoint, token=None)
    copy = controller_copy(plan.manifest, s.controller_model_dir, s.controller_endpoint, token=s.hub_token)
    assert sorted(str(p.relative_to(copy)) for p in copy.rglob("*") if p.is_file()
                  and p.name != ".sparkfleet-verified.json") == sorted(f.path for f in plan.manifest.files)
    written = [p for p in (tmp_path / "copy").rglob("*") if p.is_file() and p.stat().st_size < 2**20]
    assert written and not any(HUB_TOKEN.encode() in p.read_bytes() for p in written)


def test_plan_prints_engine_args_with_brackets_literally(tmp_path, monkeypatch, capsys):
    from sparkfleet import cli, tables

    from sparkfleet.release.engines.vllm import flag_table
    from sparkfleet.release.engines import table

    monkeypatch.setattr(tables, "CI_WIDTH", 1000)
    monkeypatch.setattr("sparkfleet.controller.inventory.hub_resolver", lambda s: (None, None, "offline"))
    # the allow-list refuses such a value (test_engine_args_allowlist.py); the printer must not depend on it
    monkeypatch.setitem(flag_table("0.33.0").reviewed, "--chat-template-content-format", "choice")
    monkeypatch.setattr(table, "value_problem", lambda *args: None)
    path = tmp_path / "fleet.py"
    args = ["--chat-template-content-format", "[/]"]  # a value a flag takes; printed, never read as markup
    path.write_text(f"sparks = [('spark-x', {{'extra_engine_args': {args!r}, 'services': "
                    f"{{'embed': {{'recipe': 'qwen3-embedding-0.6b', 'extra_engine_args': {args!r}}}}}}})]\n")
    assert cli.main(["plan", str(path)]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.count("--chat-template-content-format [/]") >= 2
