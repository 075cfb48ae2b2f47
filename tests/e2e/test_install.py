"""`pip install .` into a fresh virtual environment: the `sparkfleet` command, the stages and deploy files, installed.

Needs the package index, and for the last test the simulated fleet: e2e, about 30 s with pip's cache warm.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sparkfleet import __version__

from .conftest import HOSTS, ROOT, container, converge, ssh

pytestmark = pytest.mark.e2e

# What a clean clone hands to `pip install .` (tests, tools and the simulator stay out).
SOURCES = ("pyproject.toml", "README.md", "sparkfleet", "templates", "files", "group_data", "recipes")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the venv's bin directory, a project directory outside this checkout)."""
    work = tmp_path_factory.mktemp("install")
    source = work / "source"
    source.mkdir()
    for name in SOURCES:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(ROOT / name, source / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                            if (ROOT / name).is_dir() else {}))
    subprocess.run([sys.executable, "-m", "venv", str(work / "venv")], check=True, timeout=120)
    bin_dir = work / "venv" / "bin"
    subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    str(source)], check=True, timeout=900)
    project = work / "project"
    (project / "inventory").mkdir(parents=True)
    shutil.copy2(ROOT / "inventory/office.py", project / "inventory/office.py")
    shutil.copy2(ROOT / "examples/my_deploy.py", project / "my_deploy.py")
    return bin_dir, project


def run(installed, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    bin_dir, project = installed
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.setdefault("SPARKFLEET_CACHE", str(ROOT / ".cache"))  # the fleet's controller cache: tokens, bundle, models
    return subprocess.run([str(bin_dir / args[0]), *args[1:]], cwd=project, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_sparkfleet_plan_prints_the_office_fleet(installed):
    """Whether or not the public hub answers here, the plan prints every host's release."""
    proc = run(installed, "sparkfleet", "plan", "inventory/office.py", "--json")
    assert proc.returncode == 0, proc.stderr
    hosts = json.loads(proc.stdout)["hosts"]
    assert [h["name"] for h in hosts] == ["spark-a", "spark-b", "spark-c"]
    assert hosts[0]["image"] == "vllm/vllm-openai:v0.33.0"
    assert "ExecStart=/usr/bin/docker run" in hosts[0]["unit"] and "--enable-prefix-caching" in hosts[0]["unit"]
    assert "Traceback" not in proc.stderr


def installed_paths(installed, code: str) -> list[str]:
    """What `code` prints, one path a line, run by the installed python in the project directory."""
    proc = run(installed, "python", "-c", code)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_the_stages_and_their_files_come_from_the_package(installed):
    templates, files, defaults = installed_paths(
        installed, "import sparkfleet, sparkfleet.tasks.preflight, sparkfleet.tasks.model, sparkfleet.tasks.rollback; "
        "print(sparkfleet.TEMPLATES_DIR, sparkfleet.FILES_DIR, sparkfleet.DEFAULTS_FILE, sep='\\n')")
    for path, inside in ((templates, "site-packages/sparkfleet/templates"),
                         (files, "site-packages/sparkfleet/files"),
                         (defaults, "site-packages/sparkfleet/group_data/all.py")):
        assert path.endswith(inside) and os.path.exists(path), path
    assert os.path.exists(os.path.join(templates, "sparkfleet-vllm.service.j2"))
    assert os.path.exists(os.path.join(files, "sparkfleet-fetch"))


def test_a_project_without_deploy_files_runs_the_packaged_ones(installed):
    """The project directory holds an inventory and my_deploy.py only: the fleet commands run the package's files."""
    paths = installed_paths(installed, "from sparkfleet.fleet.converge import deploy_path; "
                                       "print(deploy_path('deploy.py'), deploy_path('rollback.py'), sep='\\n')")
    assert [p.split("site-packages/")[-1] for p in paths] == ["sparkfleet/deploys/deploy.py",
                                                             "sparkfleet/deploys/rollback.py"]
    assert all(os.path.isfile(p) for p in paths)


@pytest.mark.parametrize("deploy", ["my_deploy.py", "packaged", "sparkfleet.tasks.converge"])
def test_deploys_import_the_installed_stages_and_refuse_bad_settings(installed, deploy):
    """examples/my_deploy.py, the packaged deploy file and the entry point under pyinfra: the stages imported from
    the package, the plan made, no host touched."""
    _, project = installed
    if deploy == "packaged":
        [deploy] = installed_paths(installed, "import sparkfleet; print(sparkfleet.DEPLOYS_DIR / 'deploy.py')")
    (project / "local.py").write_text("sparks = [('@local', {'kv_cache_dtype': 'fp8'})]\n")
    proc = run(installed, "pyinfra", "-y", "local.py", deploy)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in output, output[-3000:]
    assert "invalid settings; no host was changed" in output and 'set kv_cache_dtype = "auto"' in output


def test_installed_commands_drive_the_simulated_fleet(installed, converged_fleet):
    """From a directory outside the checkout holding only inventories that point at the simulated Sparks:
    the version; status with the engines on loopback (asked on each host over SSH) exits 0 with every host
    healthy; an engine's journal over SSH, and followed; `hostkeys` adds the one key its known_hosts lacked (the
    Spark's real key); examples/my_deploy.py converges a Spark, sparkfleet's part unchanged."""
    _, project = installed
    sim_inventory = str(ROOT / "inventory/sim.py")
    (project / "sim.py").write_text(f"import runpy\nsparks = runpy.run_path({sim_inventory!r})['sparks']\n")
    (project / "loopback.py").write_text(
        f"import runpy\nsparks = [(n, {{**d, 'api_host': '127.0.0.1', 'controller_api_url': None}}) for n, d in "
        f"runpy.run_path({str(ROOT / 'inventory/sim.py')!r})['sparks']]\n")
    version = run(installed, "sparkfleet", "--version")
    assert (version.returncode, version.stdout.strip()) == (0, f"sparkfleet {__version__}"), version.stderr

    status = run(installed, "sparkfleet", "status", "loopback.py", "--json")
    assert status.returncode == 0, status.stdout[-3000:] + status.stderr[-3000:]
    rows = json.loads(status.stdout)["hosts"]
    assert [(r["host"], r["via"], r["healthy"]) for r in rows] == [(h, "ssh", True) for h in HOSTS], rows

    logs = run(installed, "sparkfleet", "logs", "sim.py", "spark-1", "-n", "5")
    lines = logs.stdout.splitlines()
    assert logs.returncode == 0 and len(lines) == 5 and all(" spark-1 " in line for line in lines), logs.stderr
    bin_dir, _ = installed
    follow = subprocess.Popen([str(bin_dir / "sparkfleet"), "logs", "sim.py", "spark-1", "--follow", "-n", "1"],
                              cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([follow.stdout], [], [], 60)
        first = follow.stdout.readline() if ready else ""
        assert " spark-1 " in first and follow.poll() is None  # a line, and still following
    finally:
        follow.terminate()
        follow.wait(30)

    from sparkfleet.controller.inventory import load_hosts

    sim_known = Path(load_hosts(str(ROOT / "inventory/sim.py"))[0][1]["ssh_known_hosts_file"])  # `sim up` wrote it
    known = [line for line in sim_known.read_text().splitlines() if line.strip()]
    port = next(h["ssh_port"] for h in converged_fleet["hosts"] if h["name"] == "spark-2")
    (project / "known_hosts").write_text("".join(f"{line}\n" for line in known if f"]:{port} " not in line))
    (project / "keys.py").write_text(
        "import runpy\nfrom pathlib import Path\n"
        f"sparks = [(n, {{**d, 'ssh_known_hosts_file': str(Path(__file__).with_name('known_hosts'))}}) for n, d in "
        f"runpy.run_path({str(ROOT / 'inventory/sim.py')!r})['sparks']]\n")
    keys = run(installed, "sparkfleet", "hostkeys", "keys.py", "--json")
    assert keys.returncode == 0, keys.stderr
    found = {r["host"]: r["state"] for rs in json.loads(keys.stdout)["known_hosts"].values() for r in rs}
    assert found == {"spark-1": "known", "spark-2": "added", "spark-3": "known"}, keys.stdout
    ed25519 = [line for line in known if f"]:{port} ssh-ed25519 " in line]  # the one type it collects
    assert (project / "known_hosts").read_text().splitlines() == [
        line for line in known if f"]:{port} " not in line] + ed25519

    try:
        deploy = run(installed, "pyinfra", "-y", "sim.py", "my_deploy.py", "--limit", "spark-1", timeout=900)
    finally:
        ssh(converged_fleet, "spark-1", "rm -rf /srv/my-project")  # the fleet as the demo left it
    output = deploy.stdout + deploy.stderr
    assert deploy.returncode == 0, output[-4000:]
    assert changed_operations(output) in ([], ["The project's own operations run as before"]), output[-4000:]


def changed_operations(output: str) -> list[str]:
    """The operations pyinfra's results table counts as changed (its Success column), by name."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["Operation", "Hosts"])
    changed = []
    for line in lines[start + 1:]:
        name, *counts = line.rsplit(None, 4)
        if name.strip() == "Grand total":
            return changed
        if counts[1] != "-":
            changed.append(name.strip())
    raise AssertionError("no Grand total line")


def spark_door_port() -> int:
    """The 127.0.0.1 port where spark-1's 8080 is published: the office's front door is on its first Spark, as
    `sparkfleet init` writes it (the sim's own front-door inventory uses door-1 instead)."""
    out = subprocess.run(["docker", "port", container("spark-1"), "8080/tcp"], capture_output=True, text=True,
                         check=True).stdout
    return int(out.split()[0].rsplit(":", 1)[1])


def office_inventory(project, secrets) -> str:
    """An office's inventory in its own directory: the simulated Sparks (the sim's state file gives addresses,
    ports and keys), a front door on spark-1, its users read from a 0600 secrets file outside the project."""
    door = {"controller_front_door_url": f"http://127.0.0.1:{spark_door_port()}", "drain_timeout_s": 30,
            "front_door_allow_http": True}
    (project / "office.py").write_text(
        "import runpy\nfrom sparkfleet.fleet.users import read_secrets\n"
        f"SPARKFLEET_SECRETS = {str(secrets)!r}\n"
        f"_sim = runpy.run_path({str(ROOT / 'inventory/sim.py')!r})\n"
        f"_door = {{**{door!r}, 'front_door_users': read_secrets(SPARKFLEET_SECRETS)['users']}}\n"
        "sparks = [(n, {**d, **_door}) for n, d in _sim['sparks']]\nfront_door = [sparks[0]]\n")
    return "office.py"


@pytest.fixture
def door_on_spark1_undone(converged_fleet):
    """The office's door on spark-1 undone after the test: spark-1 converged back to the session's inventory, so
    the next module on this fleet finds it as the demo left it (a converge after it changed spark-1 too, and
    test_model_distribution's "refetched there alone" saw two hosts change)."""
    yield
    back = converge("--limit", "spark-1")
    assert back.returncode == 0 and not back.host_failed("spark-1"), back.output[-3000:]


def test_an_office_from_pip_adds_a_user_drains_rolls_out_rolls_back_and_removes_the_user(installed, converged_fleet,
                                                                                          door_on_spark1_undone,
                                                                                          tmp_path):
    """The office path with the installed commands only: plan; users add, a converge, a chat with the new key
    through the front door; users list; drain and undrain; a rollout and a rollback; an engine's journal; users
    remove and rotate, a converge: 401 for the removed and the rotated-away keys, the rotated one works."""
    from .test_front_door import chat

    _, project = installed
    secrets = tmp_path / "keys" / "office.json"  # outside the project
    secrets.parent.mkdir(mode=0o700)
    secrets.write_text(json.dumps({"api_key": "sim-key", "users": {"bob": "bob-0123456789abcdef"}}))
    secrets.chmod(0o600)
    inventory = office_inventory(project, secrets)
    url = f"http://127.0.0.1:{spark_door_port()}"
    hello = [{"role": "user", "content": "hello"}]

    planned = run(installed, "sparkfleet", "plan", inventory, "--json")
    assert planned.returncode == 0, planned.stderr[-3000:]
    doors = json.loads(planned.stdout)["front_doors"]
    assert [(d["host"], d["users"]) for d in doors] == [("spark-1", ["bob"])]
    assert "bob-0123456789abcdef" not in planned.stdout + planned.stderr
    added = run(installed, "sparkfleet", "users", "add", inventory, "alice")
    assert added.returncode == 0, added.stderr
    alice = added.stdout.strip()
    assert json.loads(secrets.read_text())["users"]["alice"] == alice and secrets.stat().st_mode & 0o077 == 0
    door = run(installed, "pyinfra", "-y", inventory, "sparkfleet.tasks.converge", "--limit", "spark-1", timeout=900)
    assert door.returncode == 0, door.stdout[-3000:] + door.stderr[-3000:]
    assert alice not in door.stdout + door.stderr
    assert chat(url, alice, hello, stream=False)[0] == 200
    listed = run(installed, "sparkfleet", "users", "list", inventory, "--json")
    assert json.loads(listed.stdout) == {"users": ["alice", "bob"]} and alice not in listed.stdout

    assert run(installed, "sparkfleet", "drain", inventory, "spark-2").returncode == 0
    try:
        status = run(installed, "sparkfleet", "status", inventory, "--json")
        assert {"host": "spark-2", "state": "drained"} in json.loads(status.stdout)["front_door"]["backends"]
    finally:
        assert run(installed, "sparkfleet", "undrain", inventory, "spark-2").returncode == 0

    before = {r["host"]: r for r in json.loads(run(installed, "sparkfleet", "status", inventory, "--json").stdout)
              ["hosts"]}
    rolled = run(installed, "sparkfleet", "rollout", inventory, "--batch", "1", "--data", "max_model_len=65536",
                 "--json", timeout=1500)
    assert rolled.returncode == 0, rolled.stdout[-3000:] + rolled.stderr[-3000:]
    report = json.loads(rolled.stdout)
    assert report["ok"] and sorted(h["host"] for h in report["hosts"] if h["result"] == "converged") == list(HOSTS)
    back = run(installed, "sparkfleet", "rollback", inventory, "--json", timeout=1500)
    assert back.returncode == 0, back.stdout[-3000:] + back.stderr[-3000:]
    after = json.loads(run(installed, "sparkfleet", "status", inventory, "--json").stdout)
    assert {r["host"]: (r["healthy"], r["ssh"]["release_id"]) for r in after["hosts"]} == \
        {h: (True, before[h]["ssh"]["release_id"]) for h in HOSTS}

    logs = run(installed, "sparkfleet", "logs", inventory, "spark-1", "-n", "3")
    assert logs.returncode == 0 and len(logs.stdout.splitlines()) == 3, logs.stderr

    assert run(installed, "sparkfleet", "users", "remove", inventory, "alice").returncode == 0
    rotated = run(installed, "sparkfleet", "users", "rotate", inventory, "bob")
    bob = rotated.stdout.strip()
    assert rotated.returncode == 0 and bob not in ("", "bob-0123456789abcdef"), rotated.stderr
    door = run(installed, "pyinfra", "-y", inventory, "sparkfleet.tasks.converge", "--limit", "spark-1", timeout=900)
    assert door.returncode == 0, door.stdout[-3000:] + door.stderr[-3000:]
    assert chat(url, alice, hello, stream=False)[0] == 401
    assert chat(url, "bob-0123456789abcdef", hello, stream=False)[0] == 401  # rotated away
    assert chat(url, bob, hello, stream=False)[0] == 200
