"""`sparkfleet plan --offline` refuses what the deploy would refuse, or what cannot work, before any host is
touched: exit 2, one line per problem naming the host(s), the setting and the fix, no traceback (issue 51, item 1).
Each case here passed `plan` (exit 0) before; a good office of the same shape still plans, and shows its chat UI."""

from __future__ import annotations

import json

import pytest

from sparkfleet import cli

KEY = "engines-key-0123456789"
BASE = {"api_host": "0.0.0.0", "api_key": KEY, "front_door_allow_http": True, "backend_key_in_clear": True,
        "front_door_users": {"alice": "alice-key-0123456789"}}


def office(tmp_path, sparks: dict | None = None, extra: str = "", one: dict | None = None,
           groups: str = "front_door = ['spark-2']\nchat_ui = ['spark-1']\n") -> str:
    """Two Sparks on their own addresses, spark-2 the front door, spark-1 the chat UI (`sparks`: data on both;
    `one`: on spark-1 alone), then `groups` and `extra` lines."""
    first = {**BASE, "ssh_hostname": "10.0.0.1", **(sparks or {}), **(one or {})}
    second = {**BASE, "ssh_hostname": "10.0.0.2", **(sparks or {})}
    path = tmp_path / "office.py"
    path.write_text(f"sparks = [('spark-1', {first!r}), ('spark-2', {second!r})]\n{groups}{extra}")
    return str(path)


def plan(capsys, inventory: str, *argv: str) -> tuple[int, list[str], str]:
    """(exit code, the refusal's lines under its heading, everything printed)."""
    rc = cli.main(["plan", inventory, "--offline", *argv])
    printed = capsys.readouterr()
    text = printed.out + printed.err
    lines = [line for line in printed.err.splitlines() if line and not line.endswith("invalid settings:")]
    return rc, lines, text


def refused(capsys, inventory: str, *wanted: str) -> str:
    """Exit 2, no traceback, exactly one line of the refusal holding every `wanted` piece: that line."""
    rc, lines, text = plan(capsys, inventory)
    assert rc == 2, text
    assert "Traceback" not in text
    hits = [line for line in lines if all(w in line for w in wanted)]
    assert len(hits) == 1, f"wanted one line with {wanted}, got: {lines}"
    assert len(hits[0]) < 400, hits[0]
    return hits[0]


def test_the_good_office_plans_and_shows_its_chat_ui(tmp_path, capsys):
    """The shape the cases below break: it plans (exit 0), and `plan` shows the chat UI's host, image and ports."""
    rc, _, text = plan(capsys, office(tmp_path))
    assert rc == 0, text
    assert "spark-1: chat UI" in text and "ghcr.io/open-webui/open-webui" in text
    assert "port 3000 of each front door" in text and "10.0.0.1:8095" in text
    rc = cli.main(["plan", office(tmp_path), "--offline", "--json"])
    ui = json.loads(capsys.readouterr().out)["chat_ui"]
    assert rc == 0 and ui["host"] == "spark-1" and ui["door_port"] == 3000 and ui["guard"] == "10.0.0.1:8095"


def test_two_hosts_in_chat_ui(tmp_path, capsys):
    refused(capsys, office(tmp_path, groups="front_door = ['spark-2']\nchat_ui = ['spark-1', 'spark-2']\n"),
            "chat_ui", "spark-1, spark-2", "keep one")


def test_users_who_differ_only_by_case(tmp_path, capsys):
    users = {"alice": "alice-key-0123456789", "Alice": "other-key-0123456789"}
    refused(capsys, office(tmp_path, {"front_door_users": users}), "spark-1", "'alice' and 'Alice'", "rename one")


def test_a_chat_ui_port_equal_to_the_doors(tmp_path, capsys):
    refused(capsys, office(tmp_path, {"chat_ui_port": 8080}), "spark-2", "`chat_ui_port` = 8080",
            "front_door_port", "pick another port")


@pytest.mark.parametrize("setting, port, clashes", [
    ("peer_port", 8000, "`api_port`"),
    ("peer_port", 18000, "the engine port of api_port"),
    ("chat_ui_host_port", 8000, "api_port"),
])
def test_two_listeners_on_one_port_of_a_host(tmp_path, capsys, setting, port, clashes):
    """Every port a host binds is listed (controller/checks.py bound_ports): any two that meet are refused."""
    refused(capsys, office(tmp_path, one={setting: port}), "spark-1", f"`{setting}` = {port}", clashes)


def test_a_door_port_clashing_with_the_monitoring_port_on_a_door_that_monitors(tmp_path, capsys):
    refused(capsys, office(tmp_path, {"monitoring_port": 8080},
                           groups="front_door = ['spark-2']\nmonitoring = ['spark-2']\n"),
            "spark-2", "monitoring_port", "8080")


def test_a_second_entry_with_the_same_name(tmp_path, capsys):
    path = tmp_path / "office.py"
    path.write_text(f"sparks = [('spark-1', {{**{BASE!r}, 'ssh_hostname': '10.0.0.1'}}), "
                    f"('spark-1', {{**{BASE!r}, 'ssh_hostname': '10.0.0.2'}})]\n")
    refused(capsys, str(path), "spark-1", "named twice", "sparks", "keep one entry")


def test_one_host_given_two_values_in_two_groups(tmp_path, capsys):
    line = refused(capsys, office(tmp_path, groups="front_door = [('spark-2', {'ssh_hostname': '10.0.0.9'})]\n"),
                   "spark-2", "`ssh_hostname`", "sparks", "front_door", "give it once")
    assert "10.0.0.9" not in line  # a value is never echoed: it may be a secret


def test_the_same_settings_in_two_groups_are_one_host(tmp_path, capsys):
    """`front_door = sparks` gives each door its data twice, the same: nothing is lost, nothing refused."""
    path = tmp_path / "office.py"
    path.write_text(f"sparks = [('spark-1', {{**{BASE!r}, 'ssh_hostname': '10.0.0.1'}})]\nfront_door = sparks\n")
    rc, _, text = plan(capsys, str(path))
    assert rc == 0, text


def test_two_hosts_on_one_address(tmp_path, capsys):
    line = refused(capsys, office(tmp_path, one={"ssh_hostname": "10.0.0.2"}), "spark-1, spark-2", "10.0.0.2")
    assert "ssh_hostname" in line


def test_two_hosts_on_one_lan_address(tmp_path, capsys):
    refused(capsys, office(tmp_path, {"lan_address": "10.0.1.5"}), "spark-1, spark-2", "10.0.1.5", "lan_address")


@pytest.mark.parametrize("typo, meant", [("chatui", "chat_ui"), ("frontdoor", "front_door"),
                                         ("monitor", "monitoring"), ("Front_Door", "front_door")])
def test_a_group_named_near_one_of_sparkfleets(tmp_path, capsys, typo, meant):
    refused(capsys, office(tmp_path, groups=f"{typo} = ['spark-1']\n"), f"group `{typo}`", "spark-1",
            f"did you mean `{meant}`")


def test_an_own_group_far_from_sparkfleets_plans(tmp_path, capsys):
    rc, _, text = plan(capsys, office(tmp_path, groups="front_door = ['spark-2']\nlab = ['spark-1']\n"))
    assert rc == 0, text


@pytest.mark.parametrize("key, meant", [("ssh_hostnmae", "ssh_hostname"), ("ssh_prot", "ssh_port"),
                                        ("ssh_usr", "ssh_user"), ("_sduo", "_sudo")])
def test_a_typo_in_a_connection_key(tmp_path, capsys, key, meant):
    """pyinfra ignores a key of its namespace it does not know: the host would be reached by its inventory name."""
    refused(capsys, office(tmp_path, one={key: "10.0.0.7"}), "spark-1", f"`{key}`", f"`{meant}`")


def test_viewers_without_a_monitoring_door(tmp_path, capsys):
    refused(capsys, office(tmp_path, {"front_door_viewers": {"carol": "carol-password-0123"}}), "spark-2",
            "front_door_viewers", "monitoring")


def test_negative_multimodal_limits(tmp_path, capsys):
    refused(capsys, office(tmp_path, {"limit_mm_per_prompt": {"image": -1, "video": 0}}), "spark-1, spark-2",
            "limit_mm_per_prompt", "greater than or equal to 0")


@pytest.mark.parametrize("image", ["[10.0.0.5]:5000/vllm/vllm-openai:v1", "0123456789abcdef" * 4,
                                   "vllm/vllm-openai:" + "v" * 129])
def test_an_image_reference_docker_refuses(tmp_path, capsys, image):
    refused(capsys, office(tmp_path, {"engine_image": image}), "spark-1, spark-2", "`engine_image`",
            "Docker image reference")


@pytest.mark.parametrize("setting, value", [
    ("expected_gpu_name", "x" * 100_000),
    ("extra_engine_args", ["--x"] * 20_000),
    ("engine_env", {"VLLM_LOGGING_LEVEL": "x" * 100_000}),
    ("hf_overrides", {"rope_scaling": "x" * 100_000}),
    ("refused_kernels", {"6.8.*": "x" * 100_000}),
])
def test_settings_100000_characters_long(tmp_path, capsys, setting, value):
    """One rule for every setting: no string over 4,096 characters, no list or dict over 10,000 items; the line
    says the size, never the value."""
    line = refused(capsys, office(tmp_path, {setting: value}), "spark-1, spark-2", f"`{setting}`", "at most")
    assert "xxxxxxxxxx" not in line


@pytest.mark.parametrize("setting, value", [("max_model_len", 10**12), ("start_timeout_s", 10**9),
                                            ("tensor_parallel_size", 10**6), ("keep_releases", 10**6),
                                            ("memory_bandwidth_gbs", 1e12)])
def test_numbers_out_of_range(tmp_path, capsys, setting, value):
    refused(capsys, office(tmp_path, {setting: value}), "spark-1, spark-2", f"`{setting}`", "less than")


def test_an_unknown_setting_100000_characters_long_is_not_echoed(tmp_path, capsys):
    line = refused(capsys, office(tmp_path, {"x" * 100_000: 1}), "unknown setting")
    assert "100,000 characters" in line


def test_every_number_setting_is_bounded_both_ways():
    """The rule behind the cases: each int or float setting has a lower and an upper bound."""
    import annotated_types

    from sparkfleet.contract.settings import Service, Settings

    unbounded = []
    for model in (Settings, Service):
        for name, field in model.model_fields.items():
            kinds = {a for a in getattr(field.annotation, "__args__", (field.annotation,))}
            if not kinds & {int, float} or kinds & {bool}:
                continue
            if not field.metadata and name.endswith("_version"):
                continue
            low = any(isinstance(m, (annotated_types.Ge, annotated_types.Gt)) for m in field.metadata)
            high = any(isinstance(m, (annotated_types.Le, annotated_types.Lt)) for m in field.metadata)
            if not (low and high):
                unbounded.append(f"{model.__name__}.{name}")
    assert not unbounded, f"give each a range (Field(ge=..., le=...)): {unbounded}"


def test_a_chat_ui_without_a_front_door(tmp_path, capsys):
    """People reach the chat UI only through a door: without one it cannot work."""
    refused(capsys, office(tmp_path, groups="chat_ui = ['spark-1']\n"), "spark-1", "without a front door",
            "front_door")


def test_a_doors_users_who_differ_only_by_case(tmp_path, capsys):
    """The door's own users (not only the chat UI host's) are the accounts people sign in with."""
    users = {"bob": "bob-key-0123456789ab", "BOB": "other-key-0123456789"}
    path = tmp_path / "office.py"
    path.write_text(f"sparks = [('spark-1', {{**{BASE!r}, 'ssh_hostname': '10.0.0.1'}}), "
                    f"('spark-2', {{**{BASE!r}, 'ssh_hostname': '10.0.0.2', 'front_door_users': {users!r}}})]\n"
                    "front_door = ['spark-2']\nchat_ui = ['spark-1']\n")
    refused(capsys, str(path), "spark-2", "`front_door_users`", "'bob' and 'BOB'", "rename one")
