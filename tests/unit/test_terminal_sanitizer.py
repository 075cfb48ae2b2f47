"""What an engine, a hub or a host sends never acts on the operator's terminal: each hostile payload of issue 36
(an escape sequence that retitles the window, clears the screen and draws a fake "ALL HEALTHY"; a 5,000-character
ESC-laden hub error; C1 and bidi manifest paths) goes through every printer (`status`, `update`, `usage`, hub
errors, refusals, progress) and no control or format character comes out; each shows as its visible escape."""

from __future__ import annotations

import io
import json
import unicodedata
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from rich.console import Console

from sparkfleet import cli, tables
from sparkfleet.commands import update as update_command
from sparkfleet.contract.shared import verify
from sparkfleet.controller import progress
from sparkfleet.fleet import usage
from sparkfleet.fleet import update as fleet_update
from sparkfleet.model.hubs import hub_resolver
from sparkfleet.model.manifest import UntrustedAnswer
from sparkfleet.refused import Refused
from sparkfleet.release.lock import Change, Lock
from sparkfleet.release.plan import plan_hosts

from .helpers import KEY, host_data
from .test_hostile_hub import http_server
from .test_status import NAME, facts, fake_fleet

SCREEN = "\x1b]0;title\a\x1b[2J\x1b[H\x1b[32mALL HEALTHY\x1b[0m"  # what the stand-in engine answered
HUB_ERROR = ("\x1b[2J\x1b[H" + "x" * 1200 + "\n") * 4 + "y" * 200  # ~5,000 characters, 8 ESC, 4 newlines
PATHS = ["a\u202egnp.exe", "\u0085x", "b\u2066c\u2069", "d\u200fe", "\x9b2Jf", "g\u2028h", "i\ufeffj"]
PAYLOADS = [SCREEN, HUB_ERROR, *PATHS, "nul\0del\x7fbell\a", "lone \ud800 surrogate"]


def hidden(text: str) -> list[str]:
    """The characters of printed output that a terminal acts on or hides (a line end between lines aside)."""
    return sorted({repr(c) for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")})


def recording(monkeypatch) -> list[io.StringIO]:
    """Every console the product makes writes to a buffer, as to a file (no colour codes of Rich's own)."""
    made = []

    def console(stderr: bool = False, log_width: int | None = None):
        made.append(io.StringIO())
        return Console(file=made[-1], width=400, emoji=False)

    monkeypatch.setattr(tables, "console", console)
    monkeypatch.setattr(progress, "console", console)
    return made


# --- the one sanitizer -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("payload", PAYLOADS)
def test_every_payload_comes_out_as_visible_escapes(payload):
    for shown in (tables.clean(payload), tables.literal(payload)):
        assert hidden(shown) == [] and "\n" not in shown and len(shown) <= tables.TEXT_MAX


def test_escapes_are_visible_and_plain_text_is_kept():
    assert tables.clean(SCREEN) == "\\x1b]0;title\\x07\\x1b[2J\\x1b[H\\x1b[32mALL HEALTHY\\x1b[0m"
    assert tables.clean("a\u202egnp.exe") == "a\\u202egnp.exe" and tables.clean("\u0085x") == "\\x85x"
    assert tables.clean("two\nlines\tand a tab") == "two\\nlines\\tand a tab"
    for kept in ("Qwen/Qwen3.5-35B-A3B", "caf\u00e9 \u00e0 la cr\u00e8me", "\u6a21\u578b", "a\u00a0b", "[/INST]"):
        assert tables.clean(kept) == kept
    assert tables.literal("[/INST]") == "\\[/INST]"  # markup stays text


def test_a_long_value_is_cut_with_a_mark():
    cut = tables.clean("x" * 5000)
    assert len(cut) == tables.TEXT_MAX and cut.endswith(tables.ELLIPSIS)
    assert tables.clean("x" * 50, limit=10) == "x" * 9 + tables.ELLIPSIS
    assert len(tables.clean("\x1b" * 5000)) <= tables.TEXT_MAX  # escapes count in the cap


# --- status: a stand-in engine on loopback, and a host's own report over SSH ---------------------------------

class HostileEngine(BaseHTTPRequestHandler):
    """An engine that serves the model and answers with escape sequences: in its model ids and its chat reply."""

    def _send(self, body: bytes, kind="application/json"):
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self._send(json.dumps({"object": "list", "data": [{"id": NAME}, {"id": SCREEN}, {"id": PATHS[0]}]})
                       .encode())
        elif self.path == "/metrics":
            self._send(b"vllm:num_requests_running 1\n", "text/plain")
        else:
            self._send(b"{}")

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(json.dumps({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": SCREEN,
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": SCREEN}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode())

    def log_message(self, *args):
        pass


def test_status_prints_no_escape_an_engine_or_a_host_sent(tmp_path, monkeypatch, capsys):
    made = recording(monkeypatch)
    sick = {"serving": False, "detail": SCREEN, "report": {"models": [SCREEN], "chat": SCREEN}, "metrics": {}}
    hostile_facts = facts(sick, driver=SCREEN, release_id=PATHS[0], toolkit="\u0085",
                          services={"embed": {"kind": "embedding", "port": 8001, "serving": False, "detail": SCREEN}},
                          watchdog={"last_probe_s_ago": 3, "last_result": SCREEN, "consecutive_failures": 0,
                                    "restarts_in_window": 0, "gave_up": False, "gpu_visible": True, "problem": SCREEN})
    with http_server(HostileEngine) as (url, _):
        inventory = tmp_path / "office.py"
        inventory.write_text(
            f"sparks = [('spark-1', {{'ssh_hostname': '10.0.0.1', 'api_key': {KEY!r}, 'controller_api_url': {url!r}}}),"
            " ('spark-2', {'ssh_hostname': '10.0.0.2'})]\n")
        fake_fleet(monkeypatch, {"spark-1": facts(), "spark-2": hostile_facts})
        for wide in (True, False):
            monkeypatch.setattr(tables, "narrow", lambda out, wide=wide: not wide)
            assert cli.main(["status", str(inventory), "--chat"]) == 1
    printed = "".join(buffer.getvalue() for buffer in made) + "".join(capsys.readouterr())
    assert hidden(printed) == [], printed
    assert "spark-1 answers: \\x1b]0;title\\x07\\x1b[2J" in printed  # the chat reply, shown for what it is
    assert "\\x1b[32mALL HEALTHY" in printed and "a\\u202egnp.exe" in printed


# --- hub errors and update ---------------------------------------------------------------------------------------

class RefusingHub(BaseHTTPRequestHandler):
    """A hub answering HTTP 400 with a 5,000-character error laden with escape sequences."""

    def do_GET(self):
        body = json.dumps({"error": HUB_ERROR}).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Error-Message", "\x1b[2J")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_hubs_error_is_cut_and_escaped_where_it_is_made(monkeypatch):
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    with http_server(RefusingHub) as (url, _):
        [plan] = plan_hosts([("a", host_data(model_hub="huggingface", model_repo="org/m", model_revision="main",
                                             hub_endpoint=url))], resolve=hub_resolver)
    assert plan.manifest is None and plan.hub_error.startswith("cannot resolve huggingface:org/m@main")
    assert hidden(plan.hub_error) == [] and "\n" not in plan.hub_error
    assert len(plan.hub_error) <= tables.TEXT_MAX


def test_update_prints_no_escape_of_a_hub_error_or_a_manifest_path(monkeypatch, capsys):
    made = recording(monkeypatch)

    hosts = [("spark-1", host_data()), ("spark-2", host_data(model_revision="v2"))]
    with pytest.raises(fleet_update.UpdateError) as caught:  # what the hub and the registry answered, quoted
        fleet_update.lock_update(Lock(), hosts, hosts, lambda s: (None, None, HUB_ERROR), lambda s: (None, SCREEN))

    def refused(inventory, limit=None):
        raise caught.value

    monkeypatch.setattr(fleet_update, "update", refused)
    assert cli.main(["update", "office.py"]) == 1
    change = Change("model", f"huggingface:{SCREEN}@main", "a" * 40, "b" * 40, tuple(PATHS), 1, 2)
    report = fleet_update.UpdateReport(Path("/srv/sparkfleet.lock"), [change], {"spark-1": (SCREEN, "\u0085")}, True)
    monkeypatch.setattr(fleet_update, "update", lambda inventory, limit=None: report)
    assert update_command.run(type("Args", (), {"inventory": "office.py", "limit": None, "json": False})()) == 0
    out, err = capsys.readouterr()
    printed = out + err + "".join(buffer.getvalue() for buffer in made)
    assert hidden(printed) == [], printed
    assert err.startswith("sparkfleet: cannot update the lock") and err.count("\n") == 1
    assert "a\\u202egnp.exe" in out


@pytest.mark.parametrize("path", PATHS)
def test_a_manifest_path_with_a_c1_or_format_character_is_refused(path):
    with pytest.raises(UntrustedAnswer, match="manifest path"):
        verify.check_manifest_path(path)


# --- usage, refusals, progress -----------------------------------------------------------------------------------

def test_usage_prints_no_escape_a_front_door_sent(monkeypatch, capsys):
    made = recording(monkeypatch)
    found = {"doors": [{"host": "door", "url": "http://10.0.0.9:8080", "ok": False, "problem": HUB_ERROR}],
             "users": {SCREEN: {**usage.empty_user(), "models": {PATHS[0]: dict.fromkeys(usage.PER_MODEL, 1)}}}}
    monkeypatch.setattr(usage, "fleet_usage", lambda inventory: found)
    assert cli.main(["usage", "office.py"]) == 1
    printed = "".join(buffer.getvalue() for buffer in made) + "".join(capsys.readouterr())
    assert hidden(printed) == [], printed
    assert "\\x1b[32mALL HEALTHY" in printed and "a\\u202egnp.exe" in printed


def test_a_refusal_prints_one_clean_line_per_line_it_means(capsys):
    assert cli.refuse(Refused(f"cannot resolve: {SCREEN}")) == 2
    assert capsys.readouterr().err == f"sparkfleet: cannot resolve: {tables.clean(SCREEN)}\n"
    cli.refuse(Refused(f"cannot resolve: {HUB_ERROR * 10}"))
    err = capsys.readouterr().err
    assert hidden(err) == [] and err.startswith("sparkfleet: cannot resolve: \\x1b[2J")
    assert max(map(len, err.splitlines())) <= 10 * tables.TEXT_MAX
    cli.refuse(Refused(f"invalid settings:\nspark-1: {SCREEN}\nspark-2: {PATHS[0]}"))
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["sparkfleet: invalid settings:", f"spark-1: {tables.clean(SCREEN)}", "spark-2: a\\u202egnp.exe"]


@pytest.mark.parametrize("live", [False, True])
def test_progress_prints_no_escape(monkeypatch, live):
    made = recording(monkeypatch)
    display = progress._Display(live=live)
    display.show([progress.HostView(SCREEN, phase=progress.Phase("ready", ready=True)),
                  progress.HostView(PATHS[0], phase=progress.Phase("loading shards", 1, 2))])
    display.close()
    printed = "".join(buffer.getvalue() for buffer in made)
    assert hidden(printed) == [], printed
    assert "ALL HEALTHY" in printed
