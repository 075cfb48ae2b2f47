"""A host's progress file is its answer, never a way to end the run (issue 36): huge numbers (`10**400`, which a
float cannot hold), NaN and infinities, wrong types, deep nesting. Each shows as unreadable for that host only;
the watch's pyinfra callback never raises, and every other host's progress goes on."""

from __future__ import annotations

import json

import pytest
from pyinfra.connectors.util import CommandOutput, OutputLine

from sparkfleet.controller import progress
from sparkfleet.controller.progress import HostView

from .test_progress import ScriptedConnector, run_watched

GOOD = {"state": "fetching", "files_done": 1, "files_total": 2, "bytes_done": 5, "bytes_total": 9, "rate_bps": 3,
        "started_at": 1001, "updated_at": 1002}
HUGE = "1" + "0" * 400  # 10**400: an int JSON reads, a float cannot hold


def raw(**values: str) -> str:
    """GOOD with some values written as raw JSON text (numbers json.dumps would not write)."""
    text = json.dumps({**GOOD, **{k: f"@{k}@" for k in values}})
    for key, value in values.items():
        text = text.replace(f'"@{key}@"', value)
    return text


HOSTILE = [
    raw(started_at=HUGE), raw(updated_at=HUGE), raw(started_at="1e400"), raw(updated_at="1e400"),
    raw(started_at="NaN"), raw(updated_at="NaN"), raw(updated_at="Infinity"), raw(started_at="-Infinity"),
    raw(bytes_total=HUGE, bytes_done="1"), raw(bytes_total=HUGE, bytes_done=HUGE), raw(rate_bps=HUGE),
    raw(files_total=HUGE), raw(started_at="-5"), raw(state="[1]"), raw(state='{"a": 1}'), raw(files_done='"1"'),
    "[" * 100_000, json.dumps([GOOD]), '"fetching"', "1e400", "{" + '"a": 1, ' * 10 + "}",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_a_hostile_progress_file_shows_as_unreadable(text):
    assert progress.read_fetch(text) is None
    view = HostView("spark-1")
    progress.update(view, 1000, text, [], engine=True)
    assert view.line() == "spark-1: progress file unreadable" and not view.finished


def test_a_readable_file_after_an_unreadable_one_is_shown_again():
    view = HostView("spark-1")
    progress.update(view, 1000, raw(started_at=HUGE), [], engine=True)
    progress.update(view, 1000, json.dumps(GOOD), [], engine=True)
    assert view.line() == "spark-1: fetch 1/2 files, 5 of 9 B, 3 B/s, ETA 1 s"
    progress.update(view, 1000, "", [], engine=True)  # no file (yet, or any more): not unreadable
    assert "unreadable" not in view.line()


class HostileFileConnector(ScriptedConnector):
    """spark-a's progress file holds started_at = 10**400; spark-b's is the scripted, readable one."""

    def run_shell_command(self, command, print_output=False, print_input=False, **arguments):
        ok, output = super().run_shell_command(command, print_output, print_input, **arguments)
        if self.host.name != "spark-a" or "@@sparkfleet-progress" not in command.get_raw_value():
            return ok, output
        return ok, CommandOutput([OutputLine("stdout", raw(started_at=HUGE)) if line.line.startswith("{") else line
                                 for line in output])


def all_ran(state) -> bool:
    """Every host's six operations ran and succeeded: the run was not ended."""
    return not state.failed_hosts and all(state.get_results_for_host(h).success_ops == 6 for h in state.inventory)


def test_one_hosts_hostile_progress_file_ends_nothing_but_its_own_line(monkeypatch, capsys):
    lines, _, state = run_watched(monkeypatch, capsys, HostileFileConnector, engine_on=("spark-a", "spark-b"))
    assert all_ran(state)
    assert "spark-a: progress file unreadable" in lines, lines
    assert [line for line in lines if line.startswith("spark-b: ")][-1] == "spark-b: engine ready", lines
    assert [line for line in lines if line.startswith("spark-a: ")][-1] == \
        "spark-a: progress file unreadable; engine ready", lines  # its gate passed: its engine serves


def test_the_watchs_callback_never_raises(monkeypatch, capsys):
    """Whatever goes wrong inside the watch (here: reading an answer), the run's callbacks return."""
    def broken(*args, **kwargs):
        raise OverflowError("int too large to convert to float")

    monkeypatch.setattr(progress, "update", broken)
    lines, _, state = run_watched(monkeypatch, capsys, ScriptedConnector, engine_on=("spark-a", "spark-b"))
    assert all_ran(state)
    assert "spark-a: progress file unreadable" in lines and "spark-b: progress file unreadable" in lines, lines
