"""What `make demo` runs prints no warning a newcomer would read as an error (gevent's MonkeyPatchWarning came
from a tool that imported requests before pyinfra's CLI patched ssl)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command", [["-m", "tools.bench_front_door", "--help"],
                                     ["-m", "sparkfleet", "status", "--help"]])
def test_the_demos_commands_start_without_a_warning(command):
    done = subprocess.run([sys.executable, "-W", "default", *command], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr

