"""Issue 19, item 8: the smaller holes, each with the hostile input that opened it.

ssh_hostname as the LAN address; engine-, hub- and host-controlled strings printed as rich markup; a hub's
config.json numbers; a rollback's engine environment; a secret staged under `_sudo`; the hub token of a
controller copy.
"""

import pytest

from sparkfleet.fleet.front_door import front_door_plan
from sparkfleet.release.plan import plan_hosts
from sparkfleet.release.settings import SettingsError, parse_settings

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
    assert line.startswith(f"spark-2: ssh_hostname = {hostname!r} is invalid: ") and "fix it in the inventory" in line


def test_status_refuses_it_too():
    with pytest.raises(SettingsError, match=r"^spark-2: ssh_hostname = .* is invalid: contains the control character"):
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
    from sparkfleet.fleet import converge, front_door, status

    monkeypatch.setattr(tables, "CI_WIDTH", 1000)  # no cell wraps
    facts = {"driver": "[red]580", "cuda": "13.0", "toolkit": "[/]", "release_id": "[link=x]r", "model_verified": True,
             "unit_active": True, "services": {"embed": {"kind": "embedding", "port": "[/]", "serving": False,
                                                          "detail": "[/] engine said no"}},
             "watchdog": {"last_probe_s_ago": 3, "last_result": "[/]", "consecutive_failures": "[b]0",
                          "restarts_in_window": 0, "gave_up": False, "gpu_visible": True}}
    row = {"host": "spark-x", "url": "http://10.0.0.9:8000", "healthy": True, "served": [MODEL_ID, "[bold]m"],
           "metrics": {}, "error": "[/] hub error", "chat": REPLY, "ssh": facts}
    monkeypatch.setattr(converge, "read_hosts", lambda inv, names, fact: {n: facts for n in names})
    monkeypatch.setattr(status, "host_row", lambda *a, **k: row)
    monkeypatch.setattr(front_door, "front_door_status", lambda inv: None)
    assert cli.main(["status", inventory, "--chat"]) == 0
    out = capsys.readouterr().out
    for text in (f"spark-x answers: {REPLY}", f"{MODEL_ID}, [bold]m", "[/] hub error", "[red]580", "[link=x]r",
                 "embed:[/] NOT answering ([/] engine said no)", "[/] 3 s ago, [b]0 failing"):
        assert text in out, (text, out)


def test_plan_prints_a_hostile_hub_error_literally(inventory, monkeypatch, capsys):
    from sparkfleet import cli

    monkeypatch.setattr(cli, "hub_resolver", lambda s: (None, None, "[/] the hub said [bold]no"))
    assert cli.main(["plan", inventory]) == 0
    assert "hub unreachable: [/] the hub said [bold]no" in capsys.readouterr().out


def test_rollout_report_prints_a_hostile_detail_literally(capsys):
    from sparkfleet import cli
    from sparkfleet.fleet.rollout import HostReport

    cli._print_reports([HostReport("spark-x", "a" * 12, "b" * 12, "failed", 1.0, "[/] gate: [bold]x")], False)
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
