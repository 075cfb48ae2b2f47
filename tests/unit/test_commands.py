"""The command line: one module per command, one refusal, arguments checked by the parser before any plan, and a
parser that imports nothing heavy (pyinfra's CLI patches the stdlib with gevent when imported: commands import it
only once they run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sparkfleet import cli
from sparkfleet.commands import bench as bench_command
from sparkfleet.refused import Refused

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("pyinfra", "pyinfra_cli", "gevent", "requests", "urllib3", "huggingface_hub", "modelscope",
         "sparkfleet.controller.inventory", "sparkfleet.release", "sparkfleet.model")


def run_main(argv: list[str]) -> dict:
    """cli.main(argv) in a fresh interpreter: its exit code, stderr, CPU seconds (not wall time: a loaded machine
    stretches that, not the work), and the heavy modules it imported."""
    script = ("import json, sys, time\n"
              "start = time.process_time()\n"
              "from sparkfleet.cli import main\n"
              "try:\n"
              f"    code = main({argv!r})\n"
              "except SystemExit as exc:\n"
              "    code = exc.code\n"
              "seconds = time.process_time() - start\n"
              f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r} or m.startswith({HEAVY!r}))\n"
              "print(json.dumps({'code': code, 'seconds': seconds, 'heavy': heavy}))\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    return {**json.loads(proc.stdout.splitlines()[-1]), "err": proc.stderr}


@pytest.mark.parametrize("batch", ["0", "0%", "x", "-1", "2 hosts"])
def test_a_bad_batch_is_refused_by_the_parser_before_any_plan(batch):
    for command in ("rollout", "upgrade"):
        found = run_main([command, "inventory/office.py", "--batch", batch])
        assert found["code"] == 2 and found["heavy"] == [], found  # no inventory loaded, no plan, no hub client
        assert found["err"] == (f"sparkfleet: argument --batch: {batch!r}: give a number of hosts (e.g. 2) or a "
                                f"percentage (e.g. 25%) (see `sparkfleet {command} --help`)\n")
        assert found["seconds"] < 1.0, found


def test_a_bad_batch_never_reaches_the_plan_in_process(monkeypatch, capsys):
    from sparkfleet.controller import inventory
    from sparkfleet.fleet import rollout

    monkeypatch.setattr(rollout, "planned", lambda *a, **k: pytest.fail("planned"))
    monkeypatch.setattr(inventory, "hub_resolver", lambda s: pytest.fail("a hub was asked"))
    assert cli.main(["rollout", "inventory/office.py", "--batch", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sparkfleet: argument --batch: '0': ") and err.count("\n") == 1


def test_help_imports_nothing_heavy():
    found = run_main(["--help"])
    assert found["code"] == 0 and found["heavy"] == [], found


def test_every_command_registers_the_same_way():
    names = [c.NAME for c in cli.COMMANDS]
    assert len(names) == len(set(names)) and all(callable(c.arguments) and callable(c.run) for c in cli.COMMANDS)
    sub = next(a for a in cli.parser()._actions if a.dest == "command")
    assert list(sub.choices) == names
    for name, one in sub.choices.items():
        assert one.get_default("func") is next(c.run for c in cli.COMMANDS if c.NAME == name)


def test_a_refusal_raised_in_a_command_is_printed_once_with_its_code(monkeypatch, capsys):
    from sparkfleet.commands import recipes

    def refuses(args):
        raise Refused("something is wrong: do this instead", 1)

    monkeypatch.setattr(recipes, "run", refuses)
    assert cli.main(["recipes"]) == 1
    assert capsys.readouterr().err == "sparkfleet: something is wrong: do this instead\n"


@pytest.mark.parametrize("argv", [["plan", "inventory/office.py", "--data", "no-equals-sign"],
                                  ["users", "limit", "inventory/office.py", "carol", "--max-concurrent", "x"],
                                  ["bench", "--url", "http://127.0.0.1:9", "--concurrency", "0"],
                                  ["status"]])
def test_the_parser_refuses_in_one_line_with_exit_2(argv, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("sparkfleet: ") and err.count("\n") == 1 and "--help`)" in err


def test_benchs_defaults_on_the_command_line_are_the_benchmarks():
    from sparkfleet.fleet import bench

    assert (bench_command.DEFAULT_MODEL, bench_command.API_KEY_VARIABLE, bench_command.DEFAULT_CONCURRENCY,
            bench_command.DEFAULT_MAX_TOKENS, bench_command.DEFAULT_TIMEOUT_S) == (
        bench.DEFAULT_MODEL, bench.API_KEY_VARIABLE, bench.DEFAULT_CONCURRENCY, bench.DEFAULT_MAX_TOKENS,
        bench.DEFAULT_TIMEOUT_S)


def test_batch_sizes():
    from sparkfleet.fleet.batches import batch_size

    assert [batch_size("2", 10), batch_size("25%", 10), batch_size("1%", 10), batch_size(" 3 ", 1)] == [2, 2, 1, 3]
    with pytest.raises(ValueError, match="--batch '0%': give a number"):
        batch_size("0%", 10)
