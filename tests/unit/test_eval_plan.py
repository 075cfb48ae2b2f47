"""What `plan` refuses of the quality settings before any host is touched (exit 2, one line, no traceback), and
what `status` shows of a host's last evaluation."""

from __future__ import annotations

import pytest

from sparkfleet import cli
from sparkfleet.fleet import status


def office(tmp_path, **data) -> str:
    path = tmp_path / "office.py"
    path.write_text(f"sparks = [('spark-1', {{'ssh_hostname': '10.0.0.1', **{data!r}}})]\n")
    return str(path)


def plan(capsys, inventory: str) -> tuple[int, str]:
    rc = cli.main(["plan", inventory, "--offline"])
    printed = capsys.readouterr()
    return rc, printed.out + printed.err


def test_the_packaged_suite_and_an_office_suite_of_its_own_plan(tmp_path, capsys):
    (tmp_path / "probes.toml").write_text('[[probe]]\nid = "sum"\nkind = "exact"\nprompt = "2 + 2?"\n')
    assert plan(capsys, office(tmp_path))[0] == 0
    rc, text = plan(capsys, office(tmp_path, quality_probes="probes.toml"))  # the project's: the inventory's folder
    assert rc == 0, text


@pytest.mark.parametrize("content, wanted", [
    ("[[probe]\n", "does not parse as TOML"),
    ('[[probe]]\nid = "x"\nkind = "vibes"\nprompt = "p"\n', "unknown kind 'vibes'"),
])
def test_a_probe_file_that_does_not_parse_is_refused_in_one_line(tmp_path, capsys, content, wanted):
    (tmp_path / "probes.toml").write_text(content)
    rc, text = plan(capsys, office(tmp_path, quality_probes="probes.toml"))
    assert rc == 2 and "Traceback" not in text
    [line] = [line for line in text.splitlines() if wanted in line]
    assert "quality_probes" in line and "probes.toml" in line


def test_a_missing_probe_file_is_refused(tmp_path, capsys):
    rc, text = plan(capsys, office(tmp_path, quality_probes="/nowhere/probes.toml"))
    assert rc == 2 and "cannot be read" in text and "Traceback" not in text


def test_a_probe_longer_than_the_context_is_refused_naming_the_host_and_the_probe(tmp_path, capsys):
    """The packaged needle needs about 1,300 tokens: a chat model of 1,024 cannot be asked it."""
    rc, text = plan(capsys, office(tmp_path, max_model_len=1024))
    assert rc == 2 and "Traceback" not in text
    [line] = [line for line in text.splitlines() if "more than the model's context of 1024" in line]
    assert line.startswith("spark-1: ") and "probe needle" in line


@pytest.mark.parametrize("key, value, wanted", [("quality_margin", 1.0, "less than 1"),
                                                ("quality_margin", -0.01, "greater than or equal to 0"),
                                                ("quality_eval_interval_s", 600, "at least 3600")])
def test_a_margin_or_an_interval_out_of_range_is_refused(tmp_path, capsys, key, value, wanted):
    rc, text = plan(capsys, office(tmp_path, **{key: value}))
    assert rc == 2 and "Traceback" not in text
    [line] = [line for line in text.splitlines() if key in line]
    assert wanted in line


LAST = {"at": "2026-12-07T10:00:00Z", "models": {
    "chat": {"score": 0.75, "evaluated": True, "failed": ["sum"], "below": ["sum", "score"]},
    "bge": {"score": 1.0, "evaluated": True, "failed": [], "below": []},
    "rr": {"score": None, "evaluated": False, "failed": [], "below": []}}}


def test_status_shows_the_last_eval_and_a_model_below_its_baseline():
    cell = status.eval_cell(LAST)
    assert cell.startswith("2026-12-07T10:00:00Z: ")
    assert "[red]chat 0.75, failed sum (below baseline)[/]" in cell and "bge 1.00" in cell
    assert "rr not evaluated" in cell
    assert status.eval_cell(None) == "-"
    facts = {"unit_active": True, "services": {}, "last_eval": LAST}
    assert status.hidden_problems({"ssh": facts}) == ["eval: chat below its baseline (sum, score)"]


def test_the_wide_status_table_has_the_last_eval_column():
    row = {"host": "spark-1", "engine": "vllm", "healthy": True, "served": ["chat"], "metrics": {}, "error": None,
           "ssh": {"unit_active": True, "services": {}, "release_id": "r", "last_eval": LAST, "watchdog": None}}
    columns, [cells] = status.status_table([row], wide=True)
    assert cells[columns.index("last eval")] == status.eval_cell(LAST)
    _, [narrow] = status.status_table([row], wide=False)
    assert "eval: chat below its baseline" in narrow[-1]
