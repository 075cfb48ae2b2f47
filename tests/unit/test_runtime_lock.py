"""The runtime bundle's hash lock: its clients are requirements.txt's, every package is pinned and hashed,
each target gets its own blocks, and the build installs with --require-hashes and records the tarball's hash."""

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sparkfleet.controller import runtime
from sparkfleet.controller.runtime import BUNDLED, LOCK_FILE, TARGETS, build_bundle, lock_pins, target_lock
from tools.lock_runtime import REQUIREMENTS, main, marker, required_pins

LOCK = LOCK_FILE.read_text()


def test_lock_pins_the_clients_requirements_txt_pins():
    assert {n: v for n, v in lock_pins(LOCK).items() if n in BUNDLED} == required_pins(REQUIREMENTS.read_text())
    assert main(["--check"]) == 0


def test_check_fails_when_requirements_move(tmp_path, monkeypatch, capsys):
    moved = tmp_path / "requirements.txt"
    moved.write_text(REQUIREMENTS.read_text().replace("openai==", "openai==0.0.1  # was "))
    monkeypatch.setattr("tools.lock_runtime.REQUIREMENTS", moved)
    assert main(["--check"]) == 1 and "run `python -m tools.lock_runtime`" in capsys.readouterr().err


def test_every_package_is_pinned_and_hashed():
    for block in re.split(r"\n(?=\S)", "\n".join(line for line in LOCK.splitlines() if not line.startswith("#"))):
        first, *hashes = [line.strip(" \\") for line in block.splitlines()]
        assert re.fullmatch(r"[a-z0-9-]+==\S+( ; .+)?", first), first
        assert hashes and all(re.fullmatch(r"--hash=sha256:[0-9a-f]{64}", h) for h in hashes), first


@pytest.mark.parametrize("arch,python", TARGETS)
def test_each_target_gets_one_version_of_each_package_and_no_markers(arch, python):
    text = target_lock(LOCK, arch, python)
    names = [line.split("==")[0] for line in text.splitlines() if "==" in line]
    assert len(names) == len(set(names)) and ";" not in text
    assert {*BUNDLED, "urllib3", "cryptography", "pydantic", "requests"} <= set(names)


def test_markers_cover_exactly_their_targets():
    assert marker(set(TARGETS)) == ""
    assert marker({(a, "3.10") for a in ("aarch64", "x86_64")}) == 'python_version == "3.10"'
    assert marker({("aarch64", "3.12")}) == '(platform_machine == "aarch64" and python_version == "3.12")'
    assert "filelock==4.1.0" in target_lock(LOCK, "x86_64", "3.10")
    assert "filelock==4.1.0" not in target_lock(LOCK, "aarch64", "3.12")


def test_build_requires_hashes_and_records_the_tarball_hash(monkeypatch, tmp_path):
    calls = []

    def pip(cmd, check):
        calls.append((cmd, open(cmd[cmd.index("-r") + 1]).read()))
        target = cmd[cmd.index("--target") + 1]
        open(f"{target}/openai.py", "w").write("")

    monkeypatch.setattr(runtime.subprocess, "run", pip)
    bundle = build_bundle("x86_64", "3.11")
    cmd, lock = calls[0]
    assert "--require-hashes" in cmd and "--no-deps" not in cmd and lock == target_lock(LOCK, "x86_64", "3.11")
    assert bundle.sha256 == hashlib.sha256(bundle.path.read_bytes()).hexdigest()

    bundle.path.write_bytes(b"changed in the cache since")  # the recorded hash stands: the host refuses this
    again = build_bundle("x86_64", "3.11")
    assert len(calls) == 1 and again.sha256 == bundle.sha256 != hashlib.sha256(again.path.read_bytes()).hexdigest()


BUILD_ONE = """
import hashlib, os, sys, time
from pathlib import Path
from sparkfleet.controller import runtime

def slow_build(out, arch, python):  # a build that takes a while and never gives the same bytes twice
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(f".{os.getpid()}")
    partial.write_bytes(os.urandom(64))
    time.sleep(0.3)
    os.replace(partial, out)

runtime._build = slow_build
bundle = runtime.build_bundle("aarch64", "3.12")
print(bundle.sha256, hashlib.sha256(bundle.path.read_bytes()).hexdigest())
"""


def test_two_controllers_building_one_bundle_at_once_agree_on_its_bytes(tmp_path):
    """Two converges sharing the controller's cache: one builds, the other waits and takes that tarball."""
    env = {**os.environ, "SPARKFLEET_CACHE": str(tmp_path / "cache")}
    procs = [subprocess.Popen([sys.executable, "-c", BUILD_ONE], env=env, stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[2]) for _ in range(2)]
    answers = [p.communicate()[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert answers[0] == answers[1] and answers[0][0] == answers[0][1], answers
