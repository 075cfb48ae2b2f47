"""One simulated fleet for every end-to-end test: brought up clean once per run.

Tests that break something (a GPU fault knob, a reboot) repair it before they end.
Under pytest-xdist (`make e2e`: `-n 3`) each worker has a fleet of its own, the
fleets of SPARKFLEET_E2E_FLEETS in worker order ("default" is `python -m sim`'s;
default: "default,b,c"), and the modules go to the workers whole, longest first.
Without xdist the tests use SPARKFLEET_SIM_FLEET's fleet (unset: the default one).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = "inventory/sim.py"
HOSTS = ("spark-1", "spark-2", "spark-3")
# minutes each module took in a clean-clone CI run, its fleet's setup included (the slowest first to a worker:
# the fleets finish about together); others 1
MODULE_MINUTES = {"test_tensor_parallel.py": 12.8, "test_serving.py": 11.5, "test_front_door.py": 9.0,
                  "test_rollout.py": 4.6, "test_deploy.py": 2.0, "test_model_distribution.py": 1.6,
                  "test_rag.py": 3.3, "test_sim_ray.py": 1.4, "test_install.py": 4.0, "test_hostile_host.py": 1.1,
                  "test_upgrade.py": 3.5, "test_monitoring.py": 6.0, "test_engines.py": 9.0, "test_soak.py": 6.5,
                  "test_two_doors.py": 5.0, "test_on_demand.py": 2.5, "test_lock.py": 2.5, "test_sudo_user.py": 2.0,
                  # handed out first (about 11 minutes with the backup drill, 16 when Open WebUI's image is built
                  # from nothing): its reboot of spark-1 once left the next rollout's fetch unshown (the watch's poll
                  # failed on a host with no progress file yet: controller/progress.py `poll_command`), so it ran
                  # last, alone at the run's end
                  "test_chat_ui.py": 16.5}


def worker_fleet(worker: str | None, fleets: str) -> str | None:
    """The fleet of an xdist worker ("gw1": the second of the comma-separated fleets); None without xdist."""
    if not worker:
        return None
    names = [f.strip() for f in fleets.split(",") if f.strip()]
    n = int(worker.removeprefix("gw"))
    if n >= len(names):
        raise pytest.UsageError(f"pytest-xdist worker {worker} has no simulated fleet: SPARKFLEET_E2E_FLEETS "
                                f"names {len(names)} ({fleets!r}); run with -n {len(names)} or name more fleets")
    return names[n]


_FLEET = worker_fleet(os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("SPARKFLEET_E2E_FLEETS", "default,b,c"))
if _FLEET is not None:  # before anything imports sim.fleet, and inherited by pyinfra, tools and tests/infra
    os.environ["SPARKFLEET_SIM_FLEET"] = _FLEET
if os.environ.get("SPARKFLEET_SIM_FLEET", "default") not in ("", "default"):
    # a named fleet's controller cache of its own: tokens, runtime bundle and model copies (a rotation, or two
    # converges building the runtime bundle at once, stays in one fleet)
    os.environ["SPARKFLEET_CACHE"] = str(ROOT / ".sim" / "fleets" / os.environ["SPARKFLEET_SIM_FLEET"] / "cache")
# one release lock per simulated fleet, beside its state.json (sim_fleet starts a run with none: a rebuilt fleet's
# registry serves other digests)
_SIM_FLEET = os.environ.get("SPARKFLEET_SIM_FLEET", "default")
os.environ["SPARKFLEET_LOCK"] = str(ROOT / ".sim" / ("" if _SIM_FLEET in ("", "default") else f"fleets/{_SIM_FLEET}")
                                    / "sparkfleet.lock")


def pytest_collection_modifyitems(config, items):
    """Under xdist, the modules in order of MODULE_MINUTES, longest first (`--dist loadfile` hands them out
    whole in this order), each module's tests in their own order."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: -MODULE_MINUTES.get(item.path.name, 1) if "e2e" in item.path.parts else 0)


_MODULE_S: dict[tuple[str, str], float] = defaultdict(float)


def pytest_runtest_logreport(report):
    """Each module's seconds on its fleet, its setup, calls and teardowns (the fleet's own setup with the module that
    came first to it), summed where the run is reported (xdist's controller): what MODULE_MINUTES is set from."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        _MODULE_S[(getattr(report, "worker_id", None) or "-", report.nodeid.split("::")[0])] += report.duration


def pytest_terminal_summary(terminalreporter):
    """The minutes of every module by fleet, in the order each fleet ran them: the suite's budget, read per run."""
    if not _MODULE_S:
        return
    terminalreporter.write_sep("=", "minutes per module, by fleet (tests/e2e/conftest.py MODULE_MINUTES)")
    for worker in sorted({w for w, _ in _MODULE_S}):
        rows = [(Path(m).name, s) for (w, m), s in _MODULE_S.items() if w == worker]
        terminalreporter.write_line(f"{worker}: {sum(s for _, s in rows) / 60:.1f} min: "
                                    + ", ".join(f"{name} {s / 60:.1f}" for name, s in rows))


def container(host: str) -> str:
    """The Docker container of a simulated host in this run's fleet."""
    from sim.fleet.fleet import container_name

    return container_name(host)


@dataclass
class Converge:
    returncode: int
    changed: dict[str, list[str]]  # host -> names of operations that changed something
    failed: dict[str, list[str]]  # host -> names of operations that failed
    output: str
    hub_counters: dict | None = None  # the sim hub's traffic counters right after it (first_converge only)
    order: list[str] = field(default_factory=list)  # every operation's name, in the order pyinfra ran them

    def host_failed(self, host: str) -> bool:
        return bool(self.failed.get(host))


def converge(*extra: str, timeout: float = 1500, inventory: str = INVENTORY) -> Converge:
    """`pyinfra -y --json inventory/sim.py deploy.py` (or another inventory), as a user runs it; results per host."""
    proc = subprocess.run([str(ROOT / ".venv/bin/pyinfra"), "-y", "--json", inventory, "deploy.py", *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    changed: dict[str, list[str]] = defaultdict(list, {h: [] for h in HOSTS})
    failed: dict[str, list[str]] = defaultdict(list, {h: [] for h in HOSTS})
    order: list[str] = []
    try:
        results = json.loads(proc.stdout)["results"]
    except (ValueError, KeyError, TypeError):
        raise AssertionError(f"pyinfra printed no results (exit {proc.returncode}):\n{proc.stderr[-6000:]}")
    for op in results["operations"]:
        order.append(op["name"])
        for host in op["success"]:
            changed[host].append(op["name"])
        for host in op["error"]:
            failed[host].append(op["name"])
    return Converge(proc.returncode, changed, failed, proc.stderr, order=order)


@pytest.fixture(scope="session")
def sim_fleet():
    """Three simulated Sparks, from a clean slate (whatever an earlier run left is removed)."""
    from sim import fleet

    fleet.down()
    Path(os.environ["SPARKFLEET_LOCK"]).unlink(missing_ok=True)
    state = fleet.up(hosts=len(HOSTS))
    yield state


@pytest.fixture(scope="session")
def first_converge(sim_fleet):
    """The session's first converge of bare hosts, with the hub's traffic counters as it left them (later tests
    fetch again: a test of the first converge's traffic reads these). Every fixture that converges the fleet asks
    for it first, so it finds the hosts bare whichever module a worker runs first."""
    import requests

    hub = sim_fleet["hub"]["controller_url"]
    # the counters (and knobs) as a fresh hub's: a module before this fixture's first use on this worker may have
    # asked the hub already (test_engines converges its own engines' models first)
    requests.post(f"{hub}/_sim/reset", timeout=10).raise_for_status()
    done = converge()
    done.hub_counters = requests.get(f"{hub}/_sim/counters", timeout=10).json()
    return done


def fleet_out_of_step(state: dict) -> dict[str, str]:
    """Hosts not serving inventory/sim.py's release, each with why: wrong or no release, unit down, API not healthy."""
    import requests

    from sparkfleet.controller.inventory import load_hosts
    from sparkfleet.contract import paths
    from sparkfleet.model.hubs import hub_resolver
    from sparkfleet.release.image import image_resolver
    from sparkfleet.release.plan import plan_hosts

    plans = plan_hosts(load_hosts(str(ROOT / INVENTORY)), resolve=hub_resolver, resolve_image=image_resolver)
    wanted = {p.name: p.release_id for p in plans}
    out = {}
    for host in HOSTS:
        installed = ssh(state, host, f"cat {paths.RELEASE_FILE} 2>/dev/null; "
                                     f"systemctl is-active --quiet {paths.UNIT_NAME} && echo ACTIVE", check=False)
        record, _, active = installed.rpartition("}")
        release_id = json.loads(record + "}").get("release_id") if record else None
        try:
            health = requests.get(f"http://127.0.0.1:{api_port(state, host)}/health", timeout=5).status_code
        except requests.RequestException as exc:
            health = type(exc).__name__
        if release_id != wanted[host] or "ACTIVE" not in active or health != 200:
            out[host] = f"release {release_id} (want {wanted[host]}), unit {active.strip() or 'inactive'}, " \
                        f"/health {health}"
    return out


@pytest.fixture
def converged_fleet(sim_fleet, first_converge):
    """The fleet serving inventory/sim.py's release on every host, healthy; converged again first when an
    earlier test left it otherwise, so every test that needs it runs alone or in any order."""
    if fleet_out_of_step(sim_fleet):
        again = converge()
        assert again.returncode == 0, again.output[-4000:]
        assert fleet_out_of_step(sim_fleet) == {}
    return sim_fleet


@pytest.fixture(scope="session")
def hub(sim_fleet):
    return sim_fleet["hub"]["controller_url"]


# one SSH connection per host for the worker's run (OpenSSH's multiplexing): a handshake per command cost the
# 2-core CI machine more than the commands; a master whose host rebooted or stopped ends (EOF, or 3 missed
# keep-alives) and the next command starts a new one
_SSH_SOCKETS = tempfile.mkdtemp(prefix="sparkfleet-e2e-ssh-")
_SSH_SHARED = ["-o", "ControlMaster=auto", "-o", f"ControlPath={_SSH_SOCKETS}/%C", "-o", "ControlPersist=60",
               "-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3", "-o", "ConnectTimeout=10"]


def ssh(state: dict, host: str, command: str, check: bool = True) -> str:
    """Run a command on a simulated host over real SSH, as an operator would."""
    port = next(h["ssh_port"] for h in [*state["hosts"], *state.get("service_hosts", [])] if h["name"] == host)
    proc = subprocess.run(
        ["ssh", "-i", state["ssh_key"], "-p", str(port), "-o", "StrictHostKeyChecking=no",
         "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", *_SSH_SHARED, "root@127.0.0.1", command],
        capture_output=True, text=True, timeout=120,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{host}: {command}: exit {proc.returncode}: {proc.stderr}")
    return proc.stdout.strip()


def variant(tmp_path, name: str, everywhere: dict, per_host: dict | None = None) -> str:
    """An inventory that is inventory/sim.py plus some settings: a new release."""
    path = tmp_path / f"{name}.py"
    path.write_text(
        "import runpy\n"
        f"_sim = runpy.run_path({str(ROOT / 'inventory/sim.py')!r})\n"
        f"_per_host = {per_host or {}!r}\n"
        f"sparks = [(n, {{**d, **{everywhere!r}, **_per_host.get(n, {{}})}}) for n, d in _sim['sparks']]\n"
    )
    return str(path)


def sparkfleet(*args, timeout=900) -> subprocess.CompletedProcess:
    """`python -m sparkfleet ARGS`, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "sparkfleet", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def api_port(state: dict, host: str) -> int:
    """The 127.0.0.1 port the controller reaches a simulated host's API on."""
    return next(h["api_port"] for h in state["hosts"] if h["name"] == host)


def chat_tokens(state: dict, host: str, max_tokens: int = 1, timeout: float = 5) -> int:
    """The completion tokens of one chat completion on the host's API, asked as a user would (0: no answer)."""
    import requests

    try:
        reply = requests.post(f"http://127.0.0.1:{api_port(state, host)}/v1/chat/completions", timeout=timeout,
                              headers={"Authorization": "Bearer sim-key"},
                              json={"model": "Qwen3.5-35B-A3B", "max_tokens": max_tokens,
                                    "messages": [{"role": "user", "content": "ping"}]})
        return reply.json()["usage"]["completion_tokens"] if reply.status_code == 200 else 0
    except (requests.RequestException, ValueError, KeyError, TypeError):
        return 0


def started_at(state: dict, host: str) -> str:
    """When the host's engine container started: unchanged means not restarted."""
    return ssh(state, host, "docker inspect -f '{{.State.StartedAt}}' vllm")


def run_pytest_infra(*extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "tests/infra", "--inventory", INVENTORY, "-q",
                           "-p", "no:cacheprovider", *extra], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


# vLLM's routes an engine's port answered on the LAN before the guard, and the ones the fleet serves
ENGINE_PATHS = ("/health", "/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/rerank",
                "/v1/score", "/rerank", "/v2/rerank", "/score", "/metrics", "/invocations", "/pooling", "/classify",
                "/tokenize", "/detokenize", "/version", "/ping",
                # vLLM's dev and admin routes (VLLM_SERVER_DEV_MODE, runtime LoRA): refused settings, and never passed
                "/sleep", "/wake_up", "/collective_rpc", "/reset_prefix_cache", "/v1/load_lora_adapter")


_CHAT = json.dumps({"model": "Qwen3.5-35B-A3B", "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1})


def lan_statuses(state: dict, from_host: str, base: str, paths: tuple[str, ...] = ENGINE_PATHS,
                 key: str | None = None) -> dict[str, str]:
    """{path: HTTP status} of `base` + each path, asked with curl from another simulated host on the sim's LAN
    ("000": no HTTP answer, e.g. the connection refused). GET for /health, /metrics, /v1/models; else a POST of
    a one-token chat request (what /v1/chat/completions answers 200)."""
    auth = f"-H {shlex.quote('Authorization: Bearer ' + key)} " if key else ""
    lines = []
    for path in paths:
        method = "" if path in ("/health", "/metrics", "/v1/models", "/version") else \
            f"-X POST -H 'Content-Type: application/json' -d {shlex.quote(_CHAT)} "
        lines.append(f"printf '%s ' {shlex.quote(path)}; curl -s -o /dev/null -m 5 -w '%{{http_code}}\\n' "
                     f"{auth}{method}{shlex.quote(base + path)}")
    out = ssh(state, from_host, "; ".join(lines), check=False)
    return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
