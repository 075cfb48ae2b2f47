"""`sparkfleet logs`: the ssh argv carries the inventory's SSH settings and one quoted journalctl command;
nothing is run here (the ssh run is replaced), but for a stand-in `ssh` printing hostile journal lines."""

from __future__ import annotations

import json
import shlex

import pytest

from sparkfleet import cli
from sparkfleet.commands import logs as logs_command
from sparkfleet.contract import paths
from sparkfleet.fleet import logs

SSH = {"ssh_hostname": "10.0.0.1", "ssh_user": "admin", "ssh_port": 2222, "ssh_key": "/home/me/.ssh/spark",
       "ssh_strict_host_key_checking": "yes", "ssh_known_hosts_file": "/srv/office/known_hosts"}


def test_argv_uses_the_inventory_ssh_settings_and_one_quoted_remote_command():
    argv = logs.logs_argv("spark-a", SSH, "engine", [], lines=50, follow=True)
    assert argv[:-2] == ["ssh", "-p", "2222", "-l", "admin", "-i", "/home/me/.ssh/spark",
                         "-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=/srv/office/known_hosts",
                         "-o", "ConnectTimeout=10", "--"]
    assert argv[-2] == "10.0.0.1"
    assert shlex.split(argv[-1]) == ["journalctl", "--no-pager", "--unit", paths.UNIT_NAME, "--lines", "50",
                                     "--follow"]


@pytest.mark.parametrize("choice,unit", [
    ("engine", "sparkfleet-vllm.service"), ("watchdog", paths.WATCHDOG_UNIT),
    ("front-door", paths.FRONT_DOOR_UNIT_NAME), ("ray", paths.RAY_UNIT_NAME), ("embed", "sparkfleet-vllm-embed.service"),
])
def test_unit_choices_map_to_their_systemd_units(choice, unit):
    assert logs.unit_for(choice, ["embed"]) == unit


def test_an_unknown_unit_names_the_choices():
    with pytest.raises(logs.LogsError, match=r"give one of engine, watchdog, front-door, ray.*service of this host \(embed\)"):
        logs.unit_for("rerank", ["embed"])


def test_a_known_hosts_path_with_a_space_stays_one_option_value():
    argv = logs.ssh_argv("spark-a", {"ssh_known_hosts_file": '/my office/"kh"'}, ["true"])
    assert argv[2] == 'UserKnownHostsFile="/my office/\\"kh\\""'


def test_minimal_host_data_and_sudo():
    argv = logs.ssh_argv("spark-a", {"_sudo": True}, logs.journal_command("x.service", as_json=True))
    assert argv[:5] == ["ssh", "-o", "ConnectTimeout=10", "--", "spark-a"]
    assert shlex.split(argv[5])[:3] == ["sudo", "-n", "journalctl"] and argv[5].endswith("--output json")


def test_a_hostile_unit_name_cannot_reach_the_remote_shell():
    argv = logs.ssh_argv("h", {}, logs.journal_command("x; rm -rf /"))
    assert shlex.split(argv[-1])[3] == "x; rm -rf /"


@pytest.fixture
def inventory(tmp_path):
    path = tmp_path / "inv.py"
    path.write_text(f"sparks = [('spark-a', {{**{SSH!r}, 'api_host': '0.0.0.0', 'api_key': 'k' * 24, "
                    "'services': {'embed': {'recipe': 'qwen3-embedding-0.6b'}}}), ('spark-b', {})]\n")
    return str(path)


@pytest.fixture
def execs(monkeypatch):
    ran = []

    def fake(argv, out, err, as_json=False):
        ran.append(argv)
        raise SystemExit(0)

    monkeypatch.setattr(logs, "run_shown", fake)
    return ran


def test_cli_runs_ssh_with_the_service_unit_and_no_secret(inventory, execs):
    with pytest.raises(SystemExit):
        cli.main(["logs", inventory, "spark-a", "--unit", "embed", "-n", "20"])
    [argv] = execs
    assert argv[0] == "ssh" and "sparkfleet-vllm-embed.service" in argv[-1] and "k" * 24 not in " ".join(argv)


@pytest.mark.parametrize("args,needle", [
    (["spark-z"], "no host named 'spark-z' in the inventory: its hosts are spark-a, spark-b"),
    (["spark-b", "--unit", "embed"], "(this host runs no RAG service)"),
    (["spark-a", "-n", "0"], "-n 0: give a positive number of lines"),
])
def test_cli_refuses_with_one_line(inventory, execs, capsys, args, needle):
    assert cli.main(["logs", inventory, *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and execs == []


# --- what the host prints: through the one sanitizer (issue 50) ----------------------------------------------

# journal lines a hostile engine (or anything that logs on the host) wrote: a retitle, clear-screen and fake
# "ALL HEALTHY"; a bidi override; C1 as a character and as a raw byte (0x9b: CSI to an 8-bit terminal)
HOSTILE_LINES = ["\x1b]0;title\a\x1b[2J\x1b[H\x1b[32mALL HEALTHY\x1b[0m", "model a\u202egnp.exe loaded",
                 "c1 \u009b2J here", "line\u2028separator", "tab\there"]
FAKE_SSH = """#!{python}
import sys
out = sys.stdout.buffer
for line in {lines!r}:
    out.write(line.encode() + b"\\n")
out.write(b"raw \\x9b2J byte\\n")
if "--output json" in sys.argv[-1]:
    out.write('{{"MESSAGE": "\\u202e\\u0085 json", "_PID": "1"}}\\n'.encode())
out.flush()
sys.stderr.buffer.write("ssh: \\x1b[31mhost said\\u202e\\n".encode())
sys.exit(3)
"""


@pytest.fixture
def hostile_ssh(tmp_path, monkeypatch):
    """An `ssh` on PATH that prints hostile journal lines (and a hostile stderr line), exits 3. Where the command
    still replaces itself with ssh (os.execvp), the fake's bytes go straight to this process's output, as they
    would to a terminal."""
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(FAKE_SSH.format(python=sys.executable, lines=HOSTILE_LINES))
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")

    def exec_in_place(file, argv):  # what the fake prints, as the exec'd ssh would print it to the terminal
        sys.stdout.write("".join(f"{line}\n" for line in HOSTILE_LINES) + "raw \x9b2J byte\n")
        if "--output json" in argv[-1]:
            sys.stdout.write('{"MESSAGE": "\u202e\u0085 json", "_PID": "1"}\n')
        sys.stderr.write("ssh: \x1b[31mhost said\u202e\n")
        raise SystemExit(3)

    if hasattr(logs_command, "os"):  # the old command
        monkeypatch.setattr(logs_command.os, "execvp", exec_in_place)


def hidden(text: str) -> list[str]:
    import unicodedata

    return sorted({repr(c) for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")})


@pytest.mark.parametrize("as_json", [False, True])
def test_hostile_journal_lines_come_out_as_visible_escapes(inventory, hostile_ssh, capsys, as_json):
    """ESC sequences, bidi, C1 (a character and a raw byte), a line separator: every line the host printed, on
    stdout and stderr, goes through the project's sanitizer; none reaches the terminal as what it is. ssh's exit
    status is the command's."""
    try:
        code = cli.main(["logs", inventory, "spark-a", *(["--json"] if as_json else [])])
    except SystemExit as exc:  # the old command: ssh in place of this process
        code = exc.code
    out, err = capsys.readouterr()
    assert hidden(out) == [] and hidden(err) == [], (out, err)
    assert code == 3, (out, err)
    lines = out.splitlines()
    assert lines[:6] == ["\\x1b]0;title\\x07\\x1b[2J\\x1b[H\\x1b[32mALL HEALTHY\\x1b[0m",
                         "model a\\u202egnp.exe loaded", "c1 \\x9b2J here", "line\\u2028separator", "tab\\there",
                         "raw \\x9b2J byte"]
    assert err == "ssh: \\x1b[31mhost said\\u202e\n"
    if as_json:  # still JSON, each entry as journalctl wrote it, escaped as JSON escapes
        assert [json.loads(line) for line in lines[6:]] == [{"MESSAGE": "\u202e\u0085 json", "_PID": "1"}]
        assert lines[6] == '{"MESSAGE": "\\u202e\\u0085 json", "_PID": "1"}'
