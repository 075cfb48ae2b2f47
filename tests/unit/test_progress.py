"""Progress on long work: the fetch helper's progress file (written mid-fetch and at the end, against the local
hub), its reading and formatting, vLLM's phase lines, the poll command, and no polling on a no-op converge."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.deploy import add_deploy, deploy
from pyinfra.api.operations import run_ops
from pyinfra.connectors.base import BaseConnector
from pyinfra.connectors.util import CommandOutput, OutputLine

from sparkfleet.contract import paths
from sparkfleet.controller import progress
from sparkfleet.controller.progress import Fetch, HostView, Phase, PlainLines, engine_phase, fetch_text, phase_of
from sparkfleet.release.image import ImagePin
from sparkfleet.release.plan import plan_hosts

from .helpers import FETCH, STANDIN, host_data
from . import test_fetch
from .test_fetch import knobs
from .test_noop_converge import ENGINE_REF, MemoryHost, converge

GB = 10**9


# --- the helper writes it


job = test_fetch.job  # the fetch job fixture `job`: a job from the local hub, with each hub's client


def start_fetch(job: Path, progress_file: Path) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HOME": str(job.parent / "hf"),
           "MODELSCOPE_CACHE": str(job.parent / "ms")}
    return subprocess.Popen([sys.executable, str(FETCH), str(job), "--env-file", "/nonexistent", "--workers", "2",
                             "--progress-file", str(progress_file)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def watch_file(proc: subprocess.Popen, path: Path) -> list[dict]:
    """Every distinct content of the progress file while the helper runs."""
    seen = []
    while proc.poll() is None:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):  # not there yet: a rename is atomic, a half-written file is never read
            data = None
        if data and data not in seen:
            seen.append(data)
        time.sleep(0.05)
    return seen


def test_the_progress_file_counts_bytes_and_a_rate_mid_fetch_and_is_marked_done(job, local_hub, tmp_path):
    job_path, plan = job
    knobs(local_hub, throttle_bps=600_000)  # each download: ~1.7 s a shard, so the file is rewritten mid-fetch
    target = tmp_path / "run/sparkfleet/fetch-progress.json"
    proc = start_fetch(job_path, target)
    seen = watch_file(proc, target)
    assert proc.wait() == 0, proc.stderr.read()
    total = plan.manifest.total_bytes
    mid = [s for s in seen if s["state"] == "fetching" and 0 < s["bytes_done"] < total]
    assert mid and any(100_000 < s["rate_bps"] < 5_000_000 for s in mid), seen  # two downloads at 0.6 MB/s
    assert all(s["files_total"] == len(plan.manifest.files) and s["bytes_total"] == total for s in mid)
    assert all(a["bytes_done"] <= b["bytes_done"] for a, b in zip(mid, mid[1:]))
    final = json.loads(target.read_text())
    assert final["state"] == "done" and final["model_dir"] == plan.model_dir
    assert (final["files_done"], final["files_total"]) == (len(plan.manifest.files),) * 2
    assert (final["bytes_done"], final["bytes_total"], final["rate_bps"]) == (total, total, 0)
    assert final["started_at"] <= final["updated_at"]
    assert target.stat().st_mode & 0o777 == 0o644 and not list(target.parent.glob(".*.tmp"))
    shown = fetch_text(progress.read_fetch(target.read_text()))
    assert shown.startswith(f"fetched {len(plan.manifest.files)} files, ") and " MB in " in shown


def test_a_failed_fetch_is_marked_failed(job, local_hub, tmp_path):
    job_path, plan = job
    shard = next(f for f in plan.manifest.files if f.path.endswith(".safetensors"))
    knobs(local_hub, corrupt=[f"{plan.manifest.repo}/{shard.path}"])
    target = tmp_path / "progress.json"
    proc = start_fetch(job_path, target)
    assert proc.wait() == 3
    final = progress.read_fetch(target.read_text())
    assert final.state == "failed" and final.files_done == final.files_total - 1
    assert fetch_text(final).startswith(f"fetch failed at {final.files_total - 1}/{final.files_total} files")


# --- reading and formatting it


def fetch(state="fetching", files=(12, 40), size=(8.1 * GB, 37.2 * GB), rate=410_000_000, took=0.0):
    return Fetch(state, *files, int(size[0]), int(size[1]), rate, 1000.0, 1000.0 + took)


def test_fetch_lines():
    assert fetch_text(fetch()) == "fetch 12/40 files, 8.1 of 37.2 GB, 410 MB/s, ETA 71 s"
    assert fetch_text(fetch(rate=0)) == "fetch 12/40 files, 8.1 of 37.2 GB"  # no rate yet: no ETA
    assert fetch_text(fetch(size=(4 * 10**6, 900 * 10**6), rate=2_500_000)) == \
        "fetch 12/40 files, 4.0 of 900.0 MB, 2.5 MB/s, ETA 5 min 58 s"
    assert fetch_text(fetch("checking", files=(3, 40))) == "checking 3/40 files"
    assert fetch_text(fetch("done", files=(40, 40), size=(37.2 * GB,) * 2, took=95.4)) == \
        "fetched 40 files, 37.2 GB in 95 s"
    assert fetch_text(fetch("failed")) == "fetch failed at 12/40 files, 8.1 of 37.2 GB"
    assert fetch_text(fetch(size=(0, 0), files=(0, 0), rate=0)) == "fetch 0/0 files, 0 of 0 B"


def test_a_host_line_shows_the_fetch_then_the_engine():
    view = HostView("spark-1", fetch=fetch())
    assert view.line() == "spark-1: fetch 12/40 files, 8.1 of 37.2 GB, 410 MB/s, ETA 71 s"
    view.fetch = fetch("done", files=(40, 40), size=(37.2 * GB,) * 2, took=95)
    assert view.line() == "spark-1: fetched 40 files, 37.2 GB in 95 s"
    view.phase = Phase("loading shards", 7, 14)
    assert view.line() == "spark-1: engine loading shards 7/14"
    assert HostView("spark-2").line() == "spark-2: waiting"


def test_the_hosts_numbers_are_checked():
    for text in ("", "not json", "[]", "null", json.dumps({"state": "fetching"})):
        assert progress.read_fetch(text) is None, text
    good = {"state": "fetching", "model_dir": "/m", "files_done": 1, "files_total": 2, "bytes_done": 5,
            "bytes_total": 9, "rate_bps": 3, "started_at": 1.5, "updated_at": 2}
    assert progress.read_fetch(json.dumps(good)) == Fetch("fetching", 1, 2, 5, 9, 3, 1.5, 2.0)
    for bad in ({"bytes_done": -1}, {"files_done": 3}, {"bytes_done": 10}, {"rate_bps": True}, {"rate_bps": 1.5},
                {"state": "rm -rf"}, {"started_at": "yesterday"}):
        assert progress.read_fetch(json.dumps({**good, **bad})) is None, bad


# --- the engine's phases, from vLLM's own lines


@pytest.mark.parametrize("line, shown", [
    ("(APIServer pid=1) INFO 10-06 12:00:01 [api_server.py:1839] vLLM API server version 0.11.0", "starting"),
    ("(EngineCore_DP0 pid=164) INFO 01-23 15:48:47 [gpu_model_runner.py:2602] Starting to load model "
     "/models/mistral-7b...", "loading model"),
    ("Loading safetensors checkpoint shards:  50% Completed | 7/14 [00:10<00:10,  1.43s/it]", "loading shards 7/14"),
    ("(EngineCore_DP0 pid=164) INFO 01-23 15:49:07 [default_loader.py:267] Loading weights took 19.62 seconds",
     "weights loaded"),
    ("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|\u2588\u2588\u2588\u2588\u2588| 67/67 "
     "[00:12<00:00,  5.43it/s]", "CUDA graphs 67/67"),
    ("Capturing CUDA graphs (decode, FULL):  40%|\u2588\u2588\u2588\u2588      | 14/35 [00:02<00:03,  6.23it/s]\r"
     "Capturing CUDA graphs (decode, FULL):  60%|\u2588\u2588\u2588\u2588\u2588\u2588    | 21/35 [00:03<00:02,  "
     "6.23it/s]", "CUDA graphs 21/35"),
    ("(EngineCore_DP0 pid=212) INFO 10-06 12:00:40 [gpu_model_runner.py:3480] Graph capturing finished in 8 secs, "
     "took 0.31 GiB", "CUDA graphs captured"),
    ("INFO 10-06 12:00:41 [api_server.py:1971] Starting vLLM API server 0 on http://0.0.0.0:8000",
     "API server starting"),
    ("INFO:     Application startup complete.", "ready"),
    ("(EngineCore_DP0 pid=9) ERROR 02-07 15:45:42 [core.py:708] EngineCore failed to start.", "failed to start"),
    ("sparkfleet-vllm.service: Failed with result 'exit-code'.", "unit failed"),
])
def test_vllm_phase_lines(line, shown):
    assert phase_of(line).text() == shown


def test_lines_that_are_no_phase():
    for line in ("(APIServer pid=7) INFO Starting vLLM API server (sparkfleet stand-in) version 0.33.0, serving "
                 "model /models/m",  # the grep keeps it; the phase wants vLLM's "server 0 on"
                 "Loading safetensors checkpoint shards:  50% Completed | 20/14 [00:10<00:10]",  # n > N
                 "Received request chatcmpl-1: max_tokens=64", ""):
        assert phase_of(line) is None, line
    assert phase_of("Application startup complete").ready and phase_of("EngineCore failed to start").failed


def test_the_newest_phase_wins():
    lines = ["vLLM API server version 0.33.0", "Loading safetensors checkpoint shards:   0% Completed | 0/4 [00:00<?]",
             "Loading safetensors checkpoint shards:  75% Completed | 3/4 [00:01<00:00]", "unrelated"]
    assert engine_phase(lines) == Phase("loading shards", 3, 4)
    assert engine_phase([]) is None


def test_the_standins_bars_read_as_vllms(capsys):
    """sim/engine/standin_vllm.py prints vLLM's lines at the same moments of its start."""
    import runpy

    bar = runpy.run_path(str(STANDIN))["progress_bar"]
    bar("Loading safetensors checkpoint shards", 4, 0, True)
    bar("Capturing CUDA graphs (decode, FULL)", 35, 0, False)
    lines = capsys.readouterr().err.splitlines()
    assert [phase_of(line).text() for line in lines[:5]] == [f"loading shards {n}/4" for n in range(5)]
    assert engine_phase(lines) == Phase("CUDA graphs", 35, 35) and len(lines) == 5 + 11


def test_the_standins_start_reads_phase_by_phase_as_vllms(tmp_path):
    """A whole start of the stand-in, its output read line by line as the controller reads the journal: every
    phase of vLLM's start, in vLLM's order, the last one ready."""
    from .helpers import Server, make_model

    server = Server(make_model(tmp_path / "model"), SIM_LOAD_DELAY_S="0.2")
    lines = server.stop().splitlines()
    labels = [phase.label for phase in map(phase_of, lines) if phase]
    seen = [label for n, label in enumerate(labels) if label not in labels[:n]]  # each phase where it first shows
    assert seen == ["starting", "loading model", "loading shards", "weights loaded", "CUDA graphs",
                    "CUDA graphs captured", "API server starting", "ready"], labels
    assert engine_phase(lines).ready and labels[-1] == "ready"


# --- one poll


def test_the_poll_command_reads_the_file_then_the_journal_since_the_watch_began():
    first = progress.poll_command(paths.UNIT_NAME, None)
    assert first == f"date +%s; echo @@sparkfleet-progress; cat {paths.FETCH_PROGRESS} 2>/dev/null || true"
    later = progress.poll_command(paths.UNIT_NAME, 1700000000)
    assert f"journalctl --no-pager --all -o cat -u {paths.UNIT_NAME} --since @1700000000 2>/dev/null" in later
    assert "-e 'Loading safetensors checkpoint shards'" in later
    assert later.endswith("| tail -n 5 | LC_ALL=C tr -cd '\\11\\12\\15\\40-\\176' | cut -c1-300")
    assert "journalctl" not in progress.poll_command(None, 1700000000)  # a fetch only: no engine to read
    answer = ('1700000004\n@@sparkfleet-progress\n{"state": "x"}\n@@sparkfleet-progress\n'
              'vLLM API server version 0.33.0\n\n')
    now, text, lines = progress.read_poll(answer)
    assert (now, json.loads(text), lines) == (1700000004, {"state": "x"}, ["vLLM API server version 0.33.0"])
    assert progress.read_poll("") == (None, "", [])


def test_a_host_without_a_progress_file_answers_the_poll_with_its_clock(monkeypatch, tmp_path):
    """A host that just booted has no progress file (/run is empty): the poll still succeeds with the host's
    clock, so the watch begins before the fetch writes its first file. (A failed poll left the watch's start
    unset until the file appeared, later than the fetch's start: its progress was then taken for an earlier
    run's and never shown, the rollout after the chat UI's reboot of spark-1.)"""
    monkeypatch.setattr(paths, "FETCH_PROGRESS", str(tmp_path / "absent" / "fetch-progress.json"))
    for unit, since in ((None, None), (paths.UNIT_NAME, None), (None, 1700000000)):
        done = subprocess.run(["sh", "-c", progress.poll_command(unit, since)], capture_output=True, text=True)
        assert done.returncode == 0, (unit, since, done)
        now, text, lines = progress.read_poll(done.stdout)
        assert abs(now - time.time()) < 5 and text == "" and lines == []


def test_the_hosts_filter_keeps_vllms_lines_and_drops_the_rest():
    """The poll's pipeline after journalctl, run here on a journal's worth of lines: phase lines kept (a tqdm
    carriage return too), the newest five, printable ASCII only, cut."""
    pipeline = progress.poll_command(paths.UNIT_NAME, 1).rsplit("2>/dev/null | ", 1)[1]
    journal = ("vLLM API server version 0.33.0\nReceived request x\n"
               + "".join(f"Loading safetensors checkpoint shards: {n * 25:3d}% Completed | {n}/4 [00:0{n}<00:00]\n"
                         for n in range(5))
               + "Capturing CUDA graphs (decode, FULL):  50%|\u2588\u2588   | 1/2 [00:00]\r"
                 "Capturing CUDA graphs (decode, FULL): 100%|\u2588\u2588\u2588\u2588| 2/2 [00:00]\n"
               + "\x1b[31mApplication startup complete" + "x" * 400 + "\n")
    out = subprocess.run(["sh", "-c", pipeline], input=journal.encode(), capture_output=True, check=True).stdout
    lines = progress.read_poll(f"1\n@@sparkfleet-progress\n\n@@sparkfleet-progress\n{out.decode('ascii')}")[2]
    assert len(lines) == 5 and all(len(line) <= 300 and "\x1b" not in line for line in lines)
    assert engine_phase(lines[:-1]) == Phase("CUDA graphs", 2, 2) and engine_phase(lines).ready


def test_an_earlier_runs_progress_file_is_not_this_fetch():
    old = {"state": "done", "files_done": 4, "files_total": 4, "bytes_done": 9, "bytes_total": 9, "rate_bps": 0,
           "started_at": 900.0, "updated_at": 950.0}
    view = HostView("spark-1")
    progress.update(view, 1000, json.dumps(old), [], engine=True)
    assert view.fetch is None and not view.finished
    progress.update(view, 1000, json.dumps({**old, "started_at": 1001.0, "updated_at": 1010.0}), [], engine=True)
    assert view.fetch.state == "done" and not view.finished  # the engine is still to start
    progress.update(view, 1000, "", ["INFO:     Application startup complete."], engine=True)
    assert view.phase.ready and view.finished and view.line() == "spark-1: engine ready"
    fetch_only = HostView("spark-2")  # a tensor-parallel worker: no engine of its own
    progress.update(fetch_only, 1000, json.dumps({**old, "started_at": 1001.0}), [], engine=False)
    assert fetch_only.finished


def test_plain_lines_come_on_a_change_or_every_ten_seconds():
    plain, view = PlainLines(), HostView("spark-1", fetch=fetch(rate=0))
    assert plain.due(view, 100.0)
    view.fetch = fetch()  # the first line that knows the rate (and so the ETA): at once
    assert plain.due(view, 101.0)
    view.fetch = fetch(files=(13, 40), size=(9 * GB, 37.2 * GB))  # more bytes: the same phase
    assert not plain.due(view, 105.0)
    assert plain.due(view, 111.5)
    view.phase = Phase("loading shards", 1, 14)  # a new phase: at once
    assert plain.due(view, 112.0)
    view.phase = Phase("loading shards", 2, 14)
    assert not plain.due(view, 113.0)


def test_plain_lines_are_printed_literally(capsys):
    display = progress._Display(live=False)
    display.show([HostView("spark-[bold]1[/]", phase=Phase("ready", ready=True)), HostView("spark-2")])
    out = capsys.readouterr().err
    assert out == "spark-[bold]1[/]: engine ready\n"  # markup shown as text; a host with nothing to say: no line


# --- the watcher in a pyinfra run


class ScriptedConnector(BaseConnector):
    """A host whose operations each take a moment, and whose answers to the watcher's poll tell a start: the
    clock, then a fetch, then vLLM's shards, then ready."""

    handles_execution = True
    polls: list[str]

    @staticmethod
    def make_names_data(name):
        yield name, {}, []

    def connect(self):
        return None

    def put_file(self, *args, **kwargs):
        raise NotImplementedError

    def get_file(self, *args, **kwargs):
        raise NotImplementedError

    def run_shell_command(self, command, print_output=False, print_input=False, **arguments):
        import gevent

        text = command.get_raw_value()
        if "@@sparkfleet-progress" not in text:
            gevent.sleep(0.15)
            return True, CommandOutput([])
        self.polls.append(f"{self.host.name}: {text}")
        n = sum(p.startswith(f"{self.host.name}: ") for p in self.polls)
        fetch_file = {"state": "fetching" if n < 3 else "done", "files_done": 1, "files_total": 2,
                      "bytes_done": 5 * 10**6, "bytes_total": 9 * 10**6, "rate_bps": 10**6, "started_at": 1001,
                      "updated_at": 1002}
        journal = ["Loading safetensors checkpoint shards:  50% Completed | 2/4 [00:01<00:01]"] if n >= 3 else []
        journal += ["INFO:     Application startup complete."] if n >= 5 else []
        answer = ["1000", "@@sparkfleet-progress", json.dumps(fetch_file), "@@sparkfleet-progress", *journal]
        return True, CommandOutput([OutputLine("stdout", line) for line in answer])


def run_watched(monkeypatch, capsys, base, engine_on):
    """Two hosts' six operations under a watch (engine watched on the hosts `engine_on` names): (stderr's lines,
    the connector's record of polls, the state)."""
    from pyinfra import host as current_host, state as current_state
    from pyinfra.operations import server

    monkeypatch.setattr(progress, "POLL_S", 0.05)
    inventory = Inventory(([("spark-a", {}), ("spark-b", {})], {}))
    state = State(inventory, Config())
    connector = type("Connector", (base,), {"polls": []})
    for host in inventory:
        host.connector = connector(state, host)

    @deploy("Stages")
    def stages():
        for n in range(6):
            server.shell(name=f"step {n}", commands=[f"step {n}"])
        progress.watch(current_state, current_host, fetch=True, engine=current_host.name in engine_on)

    connect_all(state)
    add_deploy(state, stages)
    run_ops(state)
    progress.close(state)
    return capsys.readouterr().err.splitlines(), connector.polls, state


def test_a_run_shows_a_watched_hosts_fetch_and_start_and_polls_no_other(monkeypatch, capsys):
    lines, polls, state = run_watched(monkeypatch, capsys, ScriptedConnector, engine_on=("spark-a",))
    assert progress.watched(state) == ["spark-a", "spark-b"]
    mine = [line for line in lines if line.startswith("spark-a: ")]
    assert mine == ["spark-a: fetch 1/2 files, 5.0 of 9.0 MB, 1.0 MB/s, ETA 4 s",
                    "spark-a: fetched 2 files, 9.0 MB in 1 s", "spark-a: engine loading shards 2/4",
                    "spark-a: engine ready"], lines
    # a line a phase (the fetch's end shown before the engine's start); the last one after its last operation
    assert "spark-b: fetched 2 files, 9.0 MB in 1 s" in lines  # a fetch only: done when the file says so
    assert not [line for line in lines if "spark-b: engine" in line]
    assert not [p for p in polls if p.startswith("spark-b") and "journalctl" in p]  # no engine there


class LaggingJournalConnector(ScriptedConnector):
    """vLLM's "startup complete" line never reaches the journal in time; spark-b's last operation fails."""

    def run_shell_command(self, command, print_output=False, print_input=False, **arguments):
        ok, output = super().run_shell_command(command, print_output, print_input, **arguments)
        if self.host.name == "spark-b" and command.get_raw_value() == "step 5":
            return False, output
        return ok, CommandOutput([line for line in output if "startup complete" not in line.line])


def test_a_host_whose_operations_all_succeeded_ends_ready_one_that_failed_does_not(monkeypatch, capsys):
    """The gate's verdict, not journald's timing, ends a host's watch: the gate passed, so the engine serves."""
    lines, _, _ = run_watched(monkeypatch, capsys, LaggingJournalConnector, engine_on=("spark-a", "spark-b"))
    assert [line for line in lines if line.startswith("spark-a: ")][-1] == "spark-a: engine ready", lines
    assert not [line for line in lines if line.startswith("spark-b: ") and "ready" in line], lines
    assert any(line.startswith("spark-b: engine loading shards") for line in lines), lines


# --- a no-op converge polls nothing


def test_only_a_run_that_starts_the_engine_polls_and_a_no_op_converge_sends_nothing_more():
    pin = ImagePin(ENGINE_REF, ENGINE_REF.rpartition("@")[2], "registry")
    plan = plan_hosts([("spark-a", host_data())], resolve_image=lambda s: (pin, None))[0]
    spark = MemoryHost()
    converge(spark, plan)  # a bare host: its engine starts, so it is watched
    polls = [c for c in spark.round_trips if paths.FETCH_PROGRESS in c]
    assert polls and polls[0] == progress.poll_command(paths.UNIT_NAME, None)
    before = len(spark.round_trips)
    converge(spark, plan)  # converged: nothing fetched, nothing restarted
    assert not [c for c in spark.round_trips[before:] if paths.FETCH_PROGRESS in c or "journalctl" in c]


def test_the_stage_hook_registers_nothing_when_nothing_happens():
    class Host:
        name = "spark-a"

    class State:
        def add_callback_handler(self, handler):
            self.handler = handler

    state = State()
    progress.watch(state, Host(), fetch=False, engine=False)
    assert progress.watched(state) == [] and not hasattr(state, "handler")
    progress.watch(state, Host(), fetch=True)
    assert progress.watched(state) == ["spark-a"] and state.handler is not None
    progress.close(state)
