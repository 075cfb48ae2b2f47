"""Write sparkfleet/controller/runtime.lock: the runtime bundle's every package, pinned, with its wheels' hashes.

    .venv/bin/python -m tools.lock_runtime          # rewrite the lock (needs the package index)
    .venv/bin/python -m tools.lock_runtime --check  # exit 1 if the lock's clients differ from requirements.txt

pip resolves the four clients (at requirements.txt's pins) once per host target
(aarch64 and x86_64, CPython 3.10-3.12) with `--dry-run --report`; the lock is
the union: one version per package, and the sha256 of every wheel any target
chose. `build_bundle` installs from it with `--require-hashes`, so pip refuses any
file, version or dependency the lock does not list.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from sparkfleet import PROJECT_ROOT
from sparkfleet.controller.runtime import BUNDLED, LOCK_FILE, TARGETS, lock_pins, pip_target_args

REQUIREMENTS = PROJECT_ROOT / "requirements.txt"


def required_pins(text: str) -> dict[str, str]:
    """requirements.txt's `name==version` lines for the bundled clients."""
    pins = {}
    for line in text.splitlines():
        name, sep, version = line.split("#", 1)[0].strip().partition("==")
        if sep and name.lower() in BUNDLED:
            pins[name.lower()] = version.strip()
    return pins


def resolve(reqs: list[str], arch: str, python: str) -> dict[str, tuple[str, str]]:
    """{name: (version, sha256 of the wheel pip chose)} for one target."""
    with tempfile.TemporaryDirectory() as work:
        report = Path(work) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "--dry-run", "--ignore-installed", "--report", str(report), "--target", f"{work}/t",
                        *pip_target_args(arch, python), *reqs], check=True)
        items = json.loads(report.read_text())["install"]
    found = {}
    for item in items:
        hashes = item["download_info"].get("archive_info", {}).get("hashes", {})
        found[item["metadata"]["name"].lower().replace("_", "-")] = (item["metadata"]["version"], hashes["sha256"])
    return found


def marker(targets: set[tuple[str, str]]) -> str:
    """The environment marker that holds on exactly these targets ("" on all of them)."""
    if targets == set(TARGETS):
        return ""
    arches = sorted({a for a, _ in TARGETS})
    pythons = sorted({p for _, p in targets})
    if targets == {(a, p) for a in arches for p in pythons}:
        return " or ".join(f'python_version == "{p}"' for p in pythons)
    return " or ".join(f'(platform_machine == "{a}" and python_version == "{p}")' for a, p in sorted(targets))


def lock_text(pins: dict[str, str]) -> str:
    """One block per (package, version) with every wheel hash its targets chose, marked where not on all."""
    reqs = [f"{name}=={version}" for name, version in sorted(pins.items())]
    chosen: dict[tuple[str, str], dict] = {}
    for target in TARGETS:
        for name, (version, sha) in resolve(reqs, *target).items():
            entry = chosen.setdefault((name, version), {"targets": set(), "hashes": set()})
            entry["targets"].add(target)
            entry["hashes"].add(sha)
    lines = ["# The runtime bundle's lock: written by `python -m tools.lock_runtime`, do not edit.",
             f"# Targets: {', '.join(f'{a}/cp{p}' for a, p in TARGETS)}; build_bundle installs the blocks whose",
             "# marker holds on the host's target, with --require-hashes."]
    for (name, version), entry in sorted(chosen.items()):
        where = marker(entry["targets"])
        lines.append(f"{name}=={version}" + (f" ; {where}" if where else "") + " \\")
        hashes = sorted(entry["hashes"])
        lines += [f"    --hash=sha256:{sha}" + (" \\" if i < len(hashes) - 1 else "") for i, sha in enumerate(hashes)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare the lock with requirements.txt")
    args = parser.parse_args(argv)
    pins = required_pins(REQUIREMENTS.read_text())
    if args.check:
        locked = {n: v for n, v in lock_pins(LOCK_FILE.read_text()).items() if n in BUNDLED}
        if locked != pins:
            print(f"lock_runtime: {LOCK_FILE.name} pins {locked}, requirements.txt {pins}: "
                  f"run `python -m tools.lock_runtime`", file=sys.stderr)
            return 1
        return 0
    LOCK_FILE.write_text(lock_text(pins))
    print(f"wrote {LOCK_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
