"""A bug is a bug: only the project's refusals (sparkfleet/refused.py `Refusal`) become `sparkfleet: <line>` with
exit 2 (or 1); any other exception that leaves a command is printed with its traceback and exit 3, as pip's
`Command.main` does. A `KeyError` in the fit once printed `sparkfleet: kv_heads`, exit 2: the user's mistake, it
said."""

from __future__ import annotations

import sys

import pytest

from sparkfleet import cli
from sparkfleet.refused import BUG, FAILED, INVALID, Refusal, Refused

from .helpers import ROOT

OFFICE = str(ROOT / "inventory/office.py")


def fit_module():
    """The module whose `fit_report` the plan calls, found when the test runs (model/fit.py may be split): the
    names it looks up as it runs are its module's globals."""
    from sparkfleet.release import plan

    return sys.modules[plan.fit_report.__module__]


def test_a_key_error_in_the_fit_is_printed_as_a_bug_with_its_traceback(monkeypatch, capsys):
    """`plan --offline` reaches the fit (HostPlan.fit -> fit_report -> kv_bytes_per_token); a KeyError raised
    there is no refusal: its traceback, a line saying it is a bug, exit 3."""
    called = []

    def broken(*args, **kwargs):
        called.append(args)
        raise KeyError("kv_heads")

    monkeypatch.setattr(fit_module(), "kv_bytes_per_token", broken)  # raising=True: the name must be there
    assert cli.main(["plan", OFFICE, "--offline"]) == BUG == 3
    out = capsys.readouterr()
    assert called, "the injected KeyError never ran: the plan no longer reaches kv_bytes_per_token this way"
    assert out.err.startswith("Traceback (most recent call last):\n")
    assert "in fit_report" in out.err and "KeyError: 'kv_heads'" in out.err
    assert out.err.splitlines()[-1].startswith("sparkfleet: this is a bug in sparkfleet ")
    assert "report it" in out.err.splitlines()[-1] and "(exit 3)" in out.err.splitlines()[-1]
    assert "sparkfleet: kv_heads" not in out.err and "sparkfleet: 'kv_heads'" not in out.err
    assert out.out == ""


@pytest.mark.parametrize("exc", [FileNotFoundError("no such file: x.json"), ValueError("bad"),
                                 RuntimeError("boom"), TypeError("NoneType")])
def test_no_built_in_exception_is_a_refusal(monkeypatch, capsys, exc):
    from sparkfleet.commands import recipes

    def raises(args):
        raise exc

    monkeypatch.setattr(recipes, "run", raises)
    assert cli.main(["recipes"]) == BUG
    err = capsys.readouterr().err
    assert "Traceback (most recent call last):" in err and f"{type(exc).__name__}: {exc}" in err


def test_a_refusal_is_still_one_line_exit_2_and_no_traceback(capsys):
    """The inventory's own refusals (no file, no such host): one line each, exit 2, as before."""
    assert cli.main(["plan", str(ROOT / "inventory/no-such-inventory.py"), "--offline"]) == INVALID == 2
    err = capsys.readouterr().err
    assert err == f"sparkfleet: no inventory file at {ROOT / 'inventory/no-such-inventory.py'}\n"
    assert cli.main(["plan", OFFICE, "--offline", "--limit", "spark-z"]) == 2
    err = capsys.readouterr().err
    assert err == f"sparkfleet: no host or group named 'spark-z' in {OFFICE}\n" and "Traceback" not in err


def test_settings_keep_their_heading_and_the_inventory_and_lock_their_own_line():
    from sparkfleet.contract.settings import SettingsError
    from sparkfleet.controller.inventory import InventoryError
    from sparkfleet.release.lock import LockError

    assert SettingsError(["a: X", "b: X"]).line() == "invalid settings:\na, b: X"
    assert InventoryError("inv.py", OSError("gone")).line().startswith("inventory inv.py failed to load: OSError")
    assert LockError("sparkfleet.lock", "not JSON").line().startswith("lock file sparkfleet.lock: not JSON: ")


def test_the_projects_refusals_are_one_family_and_keep_their_built_in_bases():
    """cli.main catches one base class; a refusal that was a ValueError (or pyinfra's error) still is one, so the
    code that catches it as that keeps working."""
    from pyinfra.api.exceptions import PyinfraError

    from sparkfleet.contract.recipes import RecipeError
    from sparkfleet.contract.settings import SettingsError
    from sparkfleet.controller.inventory import InventoryError, NotInInventory
    from sparkfleet.fleet.front_door.commands import DoorUnreachable, DrainRefused
    from sparkfleet.fleet.logs import LogsError
    from sparkfleet.fleet.project import ProjectError
    from sparkfleet.fleet.users import SecretsError
    from sparkfleet.release.lock import LockError

    family = (Refused, SettingsError, InventoryError, LockError, NotInInventory, RecipeError, SecretsError,
              ProjectError, LogsError, DrainRefused, DoorUnreachable)
    assert all(issubclass(c, Refusal) for c in family)
    assert all(issubclass(c, ValueError) for c in (SettingsError, LockError, RecipeError, ProjectError, LogsError))
    assert issubclass(SecretsError, PyinfraError)
    assert not any(issubclass(c, (KeyError, FileNotFoundError)) for c in family)
    assert DoorUnreachable("front door door-1 did not answer").code == FAILED == 1
    assert DrainRefused("x").code == NotInInventory("x").code == RecipeError("x").code == INVALID


@pytest.mark.parametrize("refusal,code", [("SettingsError", 2), ("DoorUnreachable", 1)])
def test_a_refusal_class_raised_under_a_command_is_printed_by_main(monkeypatch, capsys, refusal, code):
    from sparkfleet.commands import recipes
    from sparkfleet.contract.settings import SettingsError
    from sparkfleet.fleet.front_door.commands import DoorUnreachable

    exc = {"SettingsError": SettingsError(["spark-1: set X"]),
           "DoorUnreachable": DoorUnreachable("front door door-1 did not answer: nothing was changed")}[refusal]

    def raises(args):
        raise exc

    monkeypatch.setattr(recipes, "run", raises)
    assert cli.main(["recipes"]) == code
    assert capsys.readouterr().err == f"sparkfleet: {exc.line()}\n"


def test_refusing_turns_only_the_classes_a_command_names():
    from sparkfleet.commands.common import refusing

    with pytest.raises(Refused) as refused, refusing(OSError, code=FAILED):
        raise OSError("the socket closed")
    assert refused.value.code == FAILED and str(refused.value) == "the socket closed"
    with pytest.raises(KeyError), refusing():
        raise KeyError("kv_heads")
    with pytest.raises(KeyError), refusing(OSError):
        raise KeyError("kv_heads")


def test_ctrl_c_and_exit_are_no_bug(monkeypatch, capsys):
    """KeyboardInterrupt leaves main as it did before (the interpreter exits 130); --help's SystemExit too."""
    from sparkfleet.commands import recipes

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(recipes, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cli.main(["recipes"])
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the epilog
    assert "exit status:" in out and "3 a bug in sparkfleet" in out and "2 refused" in out and "130" in out
