"""`status` with the defaults: an engine on loopback is asked on the host over SSH (the converge's service probe,
sparkfleet-health --once), so a healthy fleet exits 0; a narrow terminal gets a readable table; a host that did
not answer shows "-" and why."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from rich.console import Console

from sparkfleet import cli
from sparkfleet.contract import paths
from sparkfleet.contract.settings import parse_settings
from sparkfleet.fleet import converge, status
from sparkfleet.fleet.front_door import commands as fd_commands
from sparkfleet.host.serving import EngineMetrics
from sparkfleet.host.services import ServiceProbe

from .helpers import KEY, Server, host_data, make_model
from .test_serving_contract import run_health, write_serving

NAME = "Qwen3.5-35B-A3B"  # the default served name
LOOPBACK = parse_settings("spark-1", host_data(api_key=KEY))  # api_host = "127.0.0.1": the default


def facts(engine: dict | None = None, **over) -> dict:
    """What ssh_facts returns of a converged host whose engine `status` asked on the host."""
    found = {"driver": "580.95.05", "cuda": "13.0", "toolkit": "1.18.1-1", "release_id": "abc123def456",
             "model_verified": True, "unit_active": True, "services": {},
             "watchdog": {"last_probe_s_ago": 3, "last_result": "ok", "consecutive_failures": 0,
                          "restarts_in_window": 0, "gave_up": False, "gpu_visible": True, "problem": None}}
    if engine is not None:
        found["engine"] = engine
    return {**found, **over}


SERVING = {"serving": True, "detail": "", "report": {"models": [NAME], "chat": "Hello"},
           "metrics": {"vllm:num_requests_running": 2.0}}


def test_the_defaults_ask_the_engine_on_the_host():
    assert LOOPBACK.api_host == "127.0.0.1" and status.asked_on_host(LOOPBACK)
    lan = parse_settings("spark-1", host_data(api_host="0.0.0.0", api_key=KEY))
    reached = parse_settings("spark-1", host_data(controller_api_url="http://127.0.0.1:18000"))
    assert not status.asked_on_host(lan) and not status.asked_on_host(reached)


def test_a_groups_worker_runs_no_engine_to_ask():
    class Group:
        head = "spark-1"

    assert status.asked_on_host(LOOPBACK, Group(), "spark-1") and not status.asked_on_host(LOOPBACK, Group(), "spark-2")


def test_the_probe_on_the_host_sends_no_key_on_its_command_line():
    """ServiceProbe hands the helper the root-only env file; the key itself stays in it."""
    command = ServiceProbe().command(port=LOOPBACK.api_port, served_name=NAME, kind="chat",
                                     container=LOOPBACK.container_name)
    assert f"--env-file {paths.ENGINE_ENV}" in command and f"--port {paths.engine_port(LOOPBACK.api_port)}" in command
    assert KEY not in command and LOOPBACK.api_key not in command


def test_a_loopback_engine_asked_on_the_host_is_healthy_with_its_models_load_and_chat():
    row = status.host_row("spark-1", LOOPBACK, host_data(), facts(SERVING), chat=True)
    assert (row["healthy"], row["error"], row["via"], row["url"]) == (True, None, "ssh", None)
    assert row["served"] == [NAME] and row["chat"] == "Hello" and row["metrics"] == SERVING["metrics"]
    assert "chat" not in status.host_row("spark-1", LOOPBACK, host_data(), facts(SERVING))


def test_a_loopback_engine_that_does_not_answer_names_the_helpers_line():
    down = {"serving": False, "detail": "health: /v1/models: HTTP 401", "report": None, "metrics": {}}
    row = status.host_row("spark-1", LOOPBACK, host_data(), facts(down), chat=True)
    assert (row["healthy"], row["error"], row["served"]) == (False, "health: /v1/models: HTTP 401", None)
    assert "chat" not in row


def test_a_hosts_malformed_report_counts_for_nothing():
    odd = {"serving": "yes", "detail": "", "report": {"models": "[/]", "chat": 7}, "metrics": {}}
    row = status.host_row("spark-1", LOOPBACK, host_data(), facts(odd), chat=True)
    assert (row["healthy"], row["served"]) == (False, None) and "chat" not in row


def test_a_host_that_did_not_answer_over_ssh_says_so_once():
    row = status.host_row("spark-1", LOOPBACK, host_data(), None)
    assert (row["healthy"], row["error"]) == (False, "unreachable over SSH")


def test_the_real_helpers_report_makes_the_row(tmp_path, monkeypatch, capsys):
    """sparkfleet-health --once (what ServiceProbe runs) against the stand-in engine: its last line, read by
    ServiceProbe.process, gives the row its models and chat; a wrong key gives the helper's one line."""
    engine = Server(make_model(tmp_path / "model"), "--served-model-name", NAME, "--api-key", KEY)
    try:
        env_file = tmp_path / "engine.env"
        env_file.write_text(f"VLLM_API_KEY={KEY}\n")
        args = ["--serving", str(write_serving(tmp_path / "serving.json")), "--port", str(engine.port),
                "--served-name", NAME, "--container", "vllm", "--env-file", str(env_file), "--once"]
        rc, out, err = run_health(monkeypatch, capsys, *args)
        probe = ServiceProbe().process([*out.splitlines(), f"rc={rc}"])
        metrics = EngineMetrics().command(port=engine.port, names=status.METRICS)
        text = subprocess.run(["bash", "-c", metrics], capture_output=True, text=True, timeout=30).stdout
        env_file.write_text("VLLM_API_KEY=wrong\n")
        rc_bad, out_bad, err_bad = run_health(monkeypatch, capsys, *args)
    finally:
        engine.stop()
    assert rc == 0 and probe["report"]["models"] == [NAME], err
    lines = text.splitlines()
    assert sorted(line.split("{")[0] for line in lines) == sorted(status.METRICS), text
    row = status.host_row("spark-1", LOOPBACK, host_data(), facts({**probe, "metrics": {}}), chat=True)
    assert (row["healthy"], row["served"]) == (True, [NAME]) and isinstance(row["chat"], str)
    bad = ServiceProbe().process([*(out_bad + err_bad).splitlines(), f"rc={rc_bad}"])
    assert (bad["serving"], bad["report"], bad["detail"]) == (False, None, "health: /v1/models: HTTP 401")


def test_engine_metrics_reads_nothing_from_a_closed_port():
    command = EngineMetrics().command(port=9, names=status.METRICS)
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout) == (0, "")


# --- the command -----------------------------------------------------------------------------------------------


@pytest.fixture
def defaults_inventory(tmp_path):
    """Two Sparks with nothing but their addresses: every setting its default (an engine on loopback)."""
    path = tmp_path / "office.py"
    path.write_text("sparks = [('spark-1', {'ssh_hostname': '10.0.0.1'}), ('spark-2', {'ssh_hostname': '10.0.0.2'})]\n")
    return str(path)


def fake_fleet(monkeypatch, found: dict):
    """status over SSH without hosts: read_hosts calls the reader per host; ssh_facts answers `found[name]`
    (None: the host did not answer) and records the settings it was handed."""
    handed = {}

    class Host:
        def __init__(self, name):
            self.name = name

    def ssh_facts(host, group=None, settings=None):
        handed[host.name] = settings
        return found[host.name]

    monkeypatch.setattr(converge, "read_hosts", lambda inv, names, reader: {
        n: None if found[n] is None else reader(Host(n)) for n in names})
    monkeypatch.setattr(status, "ssh_facts", ssh_facts)
    monkeypatch.setattr(fd_commands, "front_door_status", lambda inv: None)
    return handed


def test_status_of_a_fleet_converged_with_the_defaults_exits_0(defaults_inventory, monkeypatch, capsys):
    handed = fake_fleet(monkeypatch, {"spark-1": facts(SERVING), "spark-2": facts(SERVING)})
    assert cli.main(["status", defaults_inventory, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["hosts"]
    assert [(r["host"], r["healthy"], r["via"], r["served"]) for r in rows] == [
        ("spark-1", True, "ssh", [NAME]), ("spark-2", True, "ssh", [NAME])]
    assert all(s.api_host == "127.0.0.1" for s in handed.values()) and set(handed) == {"spark-1", "spark-2"}


def test_status_exits_1_naming_what_failed(defaults_inventory, monkeypatch, capsys):
    down = {"serving": False, "detail": "health: /health: <urlopen error [Errno 111] Connection refused>",
            "report": None, "metrics": {}}
    fake_fleet(monkeypatch, {"spark-1": facts(SERVING), "spark-2": facts(down)})
    assert cli.main(["status", defaults_inventory, "--json"]) == 1
    rows = json.loads(capsys.readouterr().out)["hosts"]
    # the host helper's reason, its library's part in words (issue 51)
    assert [(r["healthy"], r["error"]) for r in rows] == [(True, None), (False, "health: /health: connection refused")]


def narrow_console(monkeypatch, width: int) -> list[Console]:
    made = []

    def console(stderr: bool = False, log_width: int | None = None):
        made.append(Console(width=width, record=True, emoji=False, file=open("/dev/null", "w")))
        return made[-1]

    monkeypatch.setattr("sparkfleet.tables.console", console)
    return made


def header(text: str) -> list[str]:
    """The column names of a printed table's header line."""
    line = next(line for line in text.splitlines() if " host " in line)
    return [cell.strip() for cell in re.split("[┃│]", line) if cell.strip()]


def test_a_narrow_terminal_gets_five_columns_that_fit(defaults_inventory, monkeypatch):
    made = narrow_console(monkeypatch, 80)
    sick = facts(SERVING, unit_active=False, services={"embed": {"kind": "embedding", "port": 8001, "serving": False,
                                                                   "detail": "health: /health: timed out"}})
    fake_fleet(monkeypatch, {"spark-1": sick, "spark-2": None})
    assert cli.main(["status", defaults_inventory]) == 1
    text = made[0].export_text()
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert header(text) == list(status.NARROW_COLUMNS)
    rows = [status.host_row("spark-1", LOOPBACK, host_data(), sick), unreachable_row()]
    _, [one, two] = status.status_table(rows, wide=False)
    assert one[-1] == "engine unit inactive; service embed NOT answering (health: /health: timed out)"
    assert two[-1] == "unreachable over SSH"


def test_a_wide_terminal_keeps_every_column(defaults_inventory, monkeypatch):
    made = narrow_console(monkeypatch, 220)
    fake_fleet(monkeypatch, {"spark-1": facts(SERVING), "spark-2": facts(SERVING)})
    assert cli.main(["status", defaults_inventory]) == 0
    assert header(made[0].export_text()) == list(status.WIDE_COLUMNS)


def test_a_log_gets_the_narrow_table_within_120_columns_and_a_watchdog_that_gave_up(defaults_inventory, capsys,
                                                                                     monkeypatch):
    """`make demo`'s log (stdout not a terminal): the table fits a 120-column window, one line a host when all is
    well, and what the wide table's watchdog column would show in red is still there."""
    watchdog = {**facts()["watchdog"], "gave_up": True, "consecutive_failures": 3, "restarts_in_window": 3}
    fake_fleet(monkeypatch, {"spark-1": facts(SERVING), "spark-2": facts(SERVING, watchdog=watchdog)})
    assert cli.main(["status", defaults_inventory]) == 0
    text = capsys.readouterr().out
    assert max(map(len, text.splitlines())) <= 120, text
    assert header(text) == list(status.NARROW_COLUMNS)
    assert [line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│")] == ["spark-1", "spark-2"]
    assert "GAVE UP" in next(line for line in text.splitlines() if "spark-2" in line), text


def unreachable_row() -> dict:
    return status.host_row("spark-2", LOOPBACK, host_data(), None)


def test_an_unreachable_host_shows_dashes_and_why_in_both_tables():
    _, [wide] = status.status_table([unreachable_row()], wide=True)
    host, engine, *cells, detail = wide
    health = cells[status.WIDE_COLUMNS.index("health") - 2]
    assert (host, engine, health, detail) == ("spark-2", "vllm", "[red]unreachable[/]", "unreachable over SSH")
    assert [c for c in cells if c != health] == ["-"] * (len(status.WIDE_COLUMNS) - 4), wide
    _, [narrow] = status.status_table([unreachable_row()], wide=False)
    assert narrow == ("spark-2", "vllm", "-", "[red]unreachable[/]", "-", "unreachable over SSH")


@pytest.mark.parametrize("engine, series, kv", [
    ("sglang", {"sglang:num_running_reqs": 3.0, "sglang:num_queue_reqs": 1.0, "sglang:token_usage": 0.5}, "50%"),
    ("llamacpp", {"llamacpp:requests_processing": 3.0, "llamacpp:requests_deferred": 1.0}, "n/a"),
])
def test_each_engine_shows_its_name_and_its_own_load_series(engine, series, kv):
    s = parse_settings("spark-1", host_data(engine=engine))
    assert status.load_series(engine) == tuple(series)
    row = status.host_row("spark-1", s, host_data(), facts({**SERVING, "metrics": series}))
    assert row["engine"] == engine
    _, [cells] = status.status_table([row], wide=True)
    assert cells[1] == engine and cells[-4:-1] == ("3", "1", kv)
    _, [narrow] = status.status_table([row], wide=False)
    assert narrow[1] == engine


def test_a_reached_host_shows_its_load():
    row = status.host_row("spark-1", LOOPBACK, host_data(), facts({**SERVING, "metrics": {
        "vllm:num_requests_running": 2.0, "vllm:num_requests_waiting": 0.0, "vllm:kv_cache_usage_perc": 0.25}}))
    _, [cells] = status.status_table([row], wide=True)
    assert cells[-4:-1] == ("2", "0", "25%") and cells[status.WIDE_COLUMNS.index("unit")] == "active"


def test_the_engines_load_is_read_with_its_key(monkeypatch):
    """The guard answers /metrics only with the engine's key (nothing on the LAN reads it without): status sends it."""
    import http.server
    import threading

    class Guard(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            allowed = self.headers.get("Authorization") == f"Bearer {KEY}"
            body = b"vllm:num_requests_running 3\n" if allowed and self.path == "/metrics" else b"{}"
            self.send_response(200 if allowed else 401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Guard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        s = parse_settings("spark-1", host_data(api_key=KEY, controller_api_url=url))
        row = status.host_status("spark-1", s, host_data())
    finally:
        server.shutdown()
    assert row["via"] == "http" and row["metrics"] == {"vllm:num_requests_running": 3.0}


def test_status_shows_each_sources_last_backup_and_its_exit_is_the_fleets(defaults_inventory, monkeypatch, capsys):
    """The backups' section (fleet/backup.py backup_status): shown, never changing the exit (the alert does), and
    not asked under --limit (it reaches every data host)."""
    from sparkfleet.fleet import backup

    fake_fleet(monkeypatch, {"spark-1": facts(SERVING), "spark-2": facts(SERVING)})
    rows = [backup.backup_state("chat-ui", "spark-1", {"ok": False, "last_success": 900, "error": "disk full"},
                                3600, now=1000)]
    asked = []
    monkeypatch.setattr(backup, "backup_status", lambda inv: asked.append(inv) or rows)
    assert cli.main(["status", defaults_inventory, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["backups"] == rows and asked == [defaults_inventory]
    assert cli.main(["status", defaults_inventory]) == 0
    out = capsys.readouterr().out
    assert "backups" in out and "failed: disk full" in out and "100 s ago" in out
    assert cli.main(["status", defaults_inventory, "--limit", "spark-1", "--json"]) == 0
    assert "backups" not in json.loads(capsys.readouterr().out) and len(asked) == 2
