"""The soak's glue to the simulated fleet (tools/soak/ holds every decision; tools/soak/__main__.py runs this): the
soak's users, the faults' inject / restore / noticed / serving-again, the nothing-lost readings. Every container it
touches passes `soak.check_target` against the fleet's state file, every address `soak.check_address`; every wait is
bounded.
Secrets (the users' keys, the api_key) go in headers, files and stdin, never on a command line or in output."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import requests

from sparkfleet.refused import FAILED, Refused
from tools import soak

ROOT = Path(__file__).resolve().parents[1]
PYINFRA = str(ROOT / ".venv" / "bin" / "pyinfra")
SOAK_USERS = ("soak-1", "soak-2", "soak-3")
THROWAWAY = "soak-gone"
JOURNAL_CAP = 64 * 1024 * 1024  # bytes of a journal read for secrets
START_S = 60.0  # the engine's start (container, load, first answer) in the heal bound


def run(argv: Sequence[str], timeout: float, input: str | None = None, check: bool = False,
        new_session: bool = False, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(list(argv), cwd=ROOT, capture_output=True, text=True, timeout=timeout, input=input,
                          start_new_session=new_session, env=env)
    if check and done.returncode:
        raise Refused(f"{' '.join(argv[:4])} ... exited {done.returncode}: {done.stderr.strip()[-300:]}", FAILED)
    return done


class Fleet:
    """The simulated fleet as the soak reaches it: its state file, the soak's inventory, the door, the hosts."""

    def __init__(self, inventory: str, workdir: Path):
        from sim.fleet.fleet import load_state

        from sparkfleet.contract.settings import parse_settings
        from sparkfleet.controller.inventory import load_hosts, spark_hosts

        self.base = str(Path(inventory).resolve())
        self.state = load_state()
        doors = self.state.get("service_hosts") or []
        if not doors:
            raise Refused("the simulated fleet has no front door host (door-1): `python -m sim up` makes one")
        self.door = doors[0]["name"]
        self.door_container = soak.check_target(self.door, self.state)
        self.secrets_path = workdir / "secrets.json"
        self.inventory = str(workdir / "soak_inventory.py")
        # the soak's inventory sits in a temporary folder, its own project to `sparkfleet` (controller/inventory.py
        # `project_of`) where plain pyinfra uses the checkout's: one controller cache for both, the fleet's own (its
        # fleet token; a second one would rotate the hosts' token between a converge and a rollout)
        from sparkfleet.controller.inventory import project_of

        self.env = {**os.environ, "SPARKFLEET_CACHE": os.environ.get("SPARKFLEET_CACHE")
                    or str(project_of(self.base) / ".cache")}
        self.settings, self.api_urls = {}, {}
        from sparkfleet.fleet.tls import guard_client
        from sparkfleet.roles.pki import hosts_ca

        # the guards as the controller asks them (https with a client certificate where the hops are TLS)
        self._closing = contextlib.ExitStack()
        self.guards = self._closing.enter_context(guard_client(hosts_ca(load_hosts(self.base))))
        for name, data in spark_hosts(load_hosts(self.base)):
            soak.check_target(name, self.state)  # the inventory's Sparks are the fleet's, or nothing is touched
            self.settings[name] = parse_settings(name, data)
            self.api_urls[name] = self.guards.url(name, self.settings[name], data)
        self.hosts = sorted(self.settings)
        door_settings = [parse_settings(n, d) for n, d in load_hosts(self.base) if n == self.door]
        if not door_settings:
            raise Refused(f"{inventory} has no front door on {self.door}: give inventory/sim_front_door.py")
        self.api_key = door_settings[0].api_key
        self.user_key = None  # a soak user's, once added (run_soak): what door_answers asks with
        # two doors sharing a floating address (inventory/sim_two_doors.py): the load goes to the address
        self.floating = door_settings[0].front_door_address
        names = {d["name"] for d in doors}
        self.doors = sorted(n for n, d in load_hosts(self.base) if n in names and self.floating
                            and parse_settings(n, d).front_door_address == self.floating) or [self.door]
        self.lock_path = Path(os.environ.get("SPARKFLEET_LOCK", ROOT / ".sim" / "sparkfleet.lock"))
        self.lock = threading.Lock()

    def close(self) -> None:
        """The guard client's private directory (its client certificate and key) removed."""
        self._closing.close()

    # --- reaching containers ---
    def engine(self, host: str) -> str:
        """The engine's container inside the host (its `container_name` setting), quoted for a shell."""
        return shlex.quote(self.settings[host].container_name)

    def sh(self, target: str, command: str, timeout: float = 60,
           input: str | None = None) -> subprocess.CompletedProcess:
        container = soak.check_target(target, self.state)
        return run(["docker", "exec", *(["-i"] if input is not None else []), container, "sh", "-c", command],
                   timeout, input=input)

    def docker(self, action: str, target: str, timeout: float = 180) -> subprocess.CompletedProcess:
        assert action in ("stop", "start", "restart")
        stop_s = ["-t", "30"] if action != "start" else []
        return run(["docker", action, *stop_s, soak.check_target(target, self.state)], timeout)

    def address(self, target: str) -> str:
        """The container's address on the sim's LAN network, as Docker holds it."""
        container = soak.check_target(target, self.state)
        network = json.dumps(self.state["services"]["network"])
        found = run(["docker", "inspect", "-f", f"{{{{(index .NetworkSettings.Networks {network}).IPAddress}}}}",
                     container], 30).stdout.strip()
        return soak.check_address(found, {container: found} if found else {})

    # --- the soak's inventory and users ---
    def write_inventory(self) -> None:
        self.secrets_path.write_text(json.dumps({"api_key": self.api_key, "users": {}}))
        os.chmod(self.secrets_path, 0o600)
        Path(self.inventory).write_text(
            "import json as _json, runpy as _runpy\n"
            f"SPARKFLEET_SECRETS = {str(self.secrets_path)!r}\n"
            f"_base = _runpy.run_path({self.base!r})\n"
            "_users = _json.load(open(SPARKFLEET_SECRETS))['users']\n"
            "globals().update({k: v for k, v in _base.items()\n"
            "                  if not k.startswith('_') and isinstance(v, (list, tuple))})\n"
            "front_door = [(n, {**d, 'front_door_users': {**d.get('front_door_users', {}), **_users}}) "
            "for n, d in _base['front_door']]\n")

    def sparkfleet(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        return run([sys.executable, "-m", "sparkfleet", *args], timeout, env=self.env)

    def add_user(self, name: str) -> str:
        done = self.sparkfleet("users", "add", self.inventory, name, "--json", timeout=60)
        if done.returncode:
            raise Refused(f"sparkfleet users add {name} failed: {done.stderr.strip()[-300:]}", FAILED)
        return json.loads(done.stdout)["key"]

    def remove_user(self, name: str) -> None:
        done = self.sparkfleet("users", "remove", self.inventory, name, timeout=60)
        if done.returncode:
            raise Refused(f"sparkfleet users remove {name} failed: {done.stderr.strip()[-300:]}", FAILED)

    def converge(self, *extra: str, inventory: str | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
        return run([PYINFRA, "-y", *extra, inventory or self.inventory, "deploy.py"], timeout, env=self.env)

    def converge_door(self, inventory: str | None = None, whole: bool = False) -> None:
        """The door converged (with `whole`, every host of the inventory: the soak's starting point, so the
        converge after the storm is judged against this inventory, not against what the fleet ran before)."""
        limits = [] if whole else [arg for door in self.doors for arg in ("--limit", door)]
        done = self.converge(*limits, inventory=inventory,
                             timeout=900 if whole else 600)
        if done.returncode:
            raise Refused(f"the {'fleet' if whole else 'front door'}'s converge failed: "
                          f"{done.stderr.strip()[-300:]}", FAILED)

    def door_url_model(self) -> tuple[str, str, str | None]:
        from sparkfleet.fleet.front_door.commands import bench_target

        url, model, _ = bench_target(self.inventory, SOAK_USERS[0])  # the floating address of two doors
        plan = self.sparkfleet("plan", self.inventory, "--json", timeout=300)
        embedding = None
        if plan.returncode == 0:
            doors = json.loads(plan.stdout).get("front_doors") or [{}]
            embedding = next((r["served_name"] for r in doors[0].get("routes", []) if r["kind"] == "embedding"), None)
        return url, model, embedding

    # --- probes ---
    def door_states(self) -> dict[str, str]:
        from sparkfleet.fleet.front_door.runtime import backend_states
        from sparkfleet.roles.front_door.records import runtime_command

        shown = self.sh(self.door, runtime_command("show stat"), timeout=20).stdout
        return {host: row["state"] for host, row in backend_states(shown).items()}

    def engine_answers(self, host: str) -> bool:
        s = self.settings[host]
        try:
            reply = self.guards.session.post(
                f"{self.api_urls[host]}/v1/chat/completions", timeout=5,
                headers={"Authorization": f"Bearer {s.api_key}"},
                json={"model": s.served_model_name, "max_tokens": 1,
                      "messages": [{"role": "user", "content": "soak: serving?"}]})
            return reply.status_code == 200
        except requests.RequestException:
            return False

    def serving(self, host: str | None) -> bool:
        hosts = [host] if host else self.hosts
        try:
            states = self.door_states()
        except (subprocess.SubprocessError, OSError):
            return False
        return all(states.get(h) == "in" and self.engine_answers(h) for h in hosts)

    def watchdog_restarted(self, host: str, since_wall: float) -> bool:
        shown = self.sh(host, f"journalctl -u sparkfleet-watchdog --since @{int(since_wall)} -o cat "
                              "| grep -c restarting || true", timeout=20).stdout.strip()
        return shown.isdigit() and int(shown) > 0

    def noticed(self, host: str | None, since_wall: float) -> str | None:
        """Who saw the fault first: the watchdog's restart, or the front door setting the host aside."""
        if host is None:
            return None
        try:
            if self.watchdog_restarted(host, since_wall):
                return "watchdog"
            if self.door_states().get(host) not in ("in", None):
                return "front door"
        except (subprocess.SubprocessError, OSError):
            return None
        return None

    # --- readings for the nothing-lost checks ---
    def records(self) -> dict[str, dict]:
        from sparkfleet.contract import paths

        out = {}
        for host in self.hosts:
            text = self.sh(host, f"cat {shlex.quote(paths.RELEASE_FILE)}", timeout=20).stdout
            try:
                out[host] = json.loads(text)
            except ValueError:
                pass
        return out

    def lock_bytes(self) -> bytes | None:
        return self.lock_path.read_bytes() if self.lock_path.exists() else None

    def rehash(self) -> list[str]:
        from sparkfleet.contract import paths

        problems = []
        for host in self.hosts:
            dirs = []
            for record in (paths.RELEASE_FILE, paths.PREVIOUS_RELEASE_FILE):
                text = self.sh(host, f"cat {shlex.quote(record)} 2>/dev/null", timeout=20).stdout
                try:
                    dirs.append(json.loads(text)["model_dir"])
                except (ValueError, KeyError, TypeError):
                    continue
            answer = self.sh(host, "python3 -", timeout=600, input=soak.rehash_script(sorted(set(dirs)))).stdout
            problems += soak.verified_problems(host, answer)
        return problems

    def usage(self) -> dict[str, int]:
        """Requests per user as `sparkfleet usage` reports them (every door, summed); {} when a door is out."""
        from sparkfleet.fleet.usage import fleet_usage

        found = fleet_usage(self.inventory)
        if not all(door["ok"] for door in found["doors"]):
            return {}
        return {user: row["requests"] for user, row in found["users"].items()}

    def holder(self) -> str | None:
        """The door whose interface holds the floating address now."""
        ip = f"inet {self.floating.split('/')[0]}/"
        for door in self.doors:
            shown = run(["docker", "exec", soak.check_target(door, self.state), "ip", "-o", "-4", "addr", "show"],
                        20).stdout
            if ip in shown:
                return door
        return None

    def door_answers(self, url: str) -> bool:
        """A one-token chat through `url` with a soak user's key answers 200 (a door takes users' keys, never the
        backend key: with that one it answers 401 to every chat)."""
        try:
            return requests.post(f"{url}/v1/chat/completions", timeout=5,
                                 headers={"Authorization": f"Bearer {self.user_key}"},
                                 json={"model": self.settings[self.hosts[0]].served_model_name, "max_tokens": 1,
                                       "messages": [{"role": "user", "content": "soak: serving?"}]}).status_code == 200
        except requests.RequestException:
            return False

    def journals(self, since_wall: float) -> dict[str, str]:
        out = {}
        for host in [*self.hosts, *self.doors]:
            text = self.sh(host, f"journalctl --since @{int(since_wall)} -o cat | head -c {JOURNAL_CAP}",
                           timeout=120).stdout
            out[host] = text
        return out


# --- the faults ----------------------------------------------------------------------------------------------------


class Fault:
    """inject() makes it happen; hold_s later, restore() ends it as the world would (power back, cable back),
    which is no command of sparkfleet's; repair() is the soak putting right what the fleet did not by the
    fault's bound (a command: the goal says so)."""

    hold_s = 0.0

    def __init__(self, fleet: Fleet, host: str | None):
        self.fleet, self.host = fleet, host

    def inject(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        pass

    def repair(self) -> None:
        self.restore()

    def put_back(self) -> None:
        """At the end, whatever happened: undo what could still be in force (idempotent)."""

    def noticed(self, since_wall: float) -> str | None:
        return self.fleet.noticed(self.host, since_wall)

    def serving(self) -> bool:
        return self.fleet.serving(self.host)


class EngineKilled(Fault):
    def inject(self):
        self.fleet.sh(self.host, f"docker kill {self.fleet.engine(self.host)}")

    def repair(self):
        self.fleet.sh(self.host, "systemctl restart sparkfleet-vllm", timeout=300)


class EngineFrozen(Fault):
    def inject(self):
        self.fleet.sh(self.host, f"docker pause {self.fleet.engine(self.host)}")

    def repair(self):
        self.fleet.sh(self.host, f"docker unpause {self.fleet.engine(self.host)} 2>/dev/null; true")

    put_back = repair


class FrozenAfterRestart(EngineFrozen):
    """The engine restarted, and frozen within seconds of its first answer (issue 35's freeze after a start)."""

    def inject(self):
        self.fleet.sh(self.host, "systemctl restart sparkfleet-vllm", timeout=300)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not self.fleet.engine_answers(self.host):
            time.sleep(1)
        time.sleep(3)  # answered; frozen a few seconds later, before the watchdog's next tick
        super().inject()


class EngineHung(Fault):
    """The stand-in's generation-hang knob in the running container (sim/engine: health answers, chats wait;
    a restart clears it)."""

    KNOB = "/etc/sparkfleet-sim/engine.json"

    def inject(self):
        write_knob = f"mkdir -p /etc/sparkfleet-sim && cat > {self.KNOB}"
        self.fleet.sh(self.host, f"docker exec -i {self.fleet.engine(self.host)} sh -c '{write_knob}'",
                      input=json.dumps({"fault": "generation-hang"}))

    def repair(self):
        self.fleet.sh(self.host, f"docker exec -i {self.fleet.engine(self.host)} sh -c 'cat > {self.KNOB}'", input="{}")

    put_back = repair


class DockerRestarted(Fault):
    def inject(self):
        self.fleet.sh(self.host, "systemctl restart docker", timeout=300)

    def repair(self):
        self.fleet.sh(self.host, "systemctl start docker sparkfleet-vllm", timeout=300)


class HostRebooted(Fault):
    def inject(self):
        self.fleet.docker("restart", self.host)

    def repair(self):
        self.fleet.docker("start", self.host)


class HostPoweredOff(Fault):
    hold_s = 60.0

    def inject(self):
        self.fleet.docker("stop", self.host)

    def restore(self):
        self.fleet.docker("start", self.host)

    put_back = restore


class DoorNetworkCut(Fault):
    """Blackhole routes both ways: the door to the host's address and the host to the door's (iproute2 is on
    both images; no firewall rules to leave behind)."""

    hold_s = 20.0

    def _routes(self, verb: str) -> None:
        host_ip, door_ip = self.fleet.address(self.host), self.fleet.address(self.fleet.door)
        self.fleet.sh(self.fleet.door, f"ip route {verb} blackhole {host_ip}/32" + (" 2>/dev/null; true"
                                                                                    if verb == "del" else ""))
        self.fleet.sh(self.host, f"ip route {verb} blackhole {door_ip}/32" + (" 2>/dev/null; true"
                                                                               if verb == "del" else ""))

    def inject(self):
        self._routes("add")

    def restore(self):
        self._routes("del")

    put_back = restore


class DoorLost(Fault):
    """The door holding the floating address powered off (`docker stop -t 0`: no shutdown, as a power cut), back
    hold_s later. Noticed when another door holds the address (keepalived); serving again when the address answers
    a chat."""

    hold_s = 60.0

    def inject(self):
        self.lost = self.fleet.holder()
        if self.lost is None:
            raise Refused("no door holds the floating address")
        self.host = self.lost
        run(["docker", "stop", "-t", "0", soak.check_target(self.lost, self.fleet.state)], 60, check=True)

    def restore(self):
        if getattr(self, "lost", None):
            self.fleet.docker("start", self.lost)
            for _ in range(60):  # back as a backup door (up to ~2 minutes for its boot)
                if self.fleet.sh(self.lost, "systemctl is-active sparkfleet-door-address.service",
                                 timeout=20).stdout.strip() == "active":
                    break
                time.sleep(2)

    put_back = restore

    def noticed(self, since_wall: float) -> str | None:
        held = self.fleet.holder()
        return "keepalived" if held and held != getattr(self, "lost", None) else None

    def serving(self) -> bool:
        return self.fleet.door_answers(self.fleet.url)


class ShardCorrupted(Fault):
    """One byte of the largest verified shard changed in place while the engine serves; the next converge of the
    host (the command this fault needs: nothing watches the bytes between converges) must fetch it again."""

    def inject(self):
        from sparkfleet.contract import paths

        record = json.loads(self.fleet.sh(self.host, f"cat {shlex.quote(paths.RELEASE_FILE)}").stdout)
        model_dir = shlex.quote(record["model_dir"])
        self.fleet.sh(self.host, f"f=$(find {model_dir} -name '*.safetensors' -type f -printf '%s %p\\n' | sort -n "
                                 "| tail -1 | cut -d' ' -f2-) && printf X | dd of=\"$f\" bs=1 seek=4096 conv=notrunc "
                                 "2>/dev/null")

    def repair(self):
        self.fleet.converge("--limit", self.host)


class FleetCommand(Fault):
    """A fleet-wide change run during the load; restore() puts the fleet back on its release."""

    def restore(self):
        self.fleet.sparkfleet("rollout", self.fleet.inventory, "--batch", "1", timeout=1200)


class Rollout(FleetCommand):
    def inject(self):
        self.fleet.sparkfleet("rollout", self.fleet.inventory, "--batch", "1", "--data", "max_model_len=65536",
                              timeout=1200)


class Upgrade(FleetCommand):
    """A newer stand-in driver published in the sim's DGX OS repository, then `sparkfleet upgrade --batch 1`: each
    Spark upgraded and rebooted in turn under the load; afterwards every host back on the old driver (the sim's
    reset: no second reboot cycle)."""

    NEW_DRIVER = "580.95.99"

    def inject(self):
        run([sys.executable, "-m", "sim", "publish-driver", self.NEW_DRIVER], 300, check=True)
        self.fleet.sparkfleet("upgrade", self.fleet.inventory, "--batch", "1", timeout=1800)

    def restore(self):
        run([sys.executable, "-m", "sim", "reset-driver"], 600)

    put_back = restore


class HubRegistryDown(FleetCommand):
    def inject(self):
        services = self.fleet.state["services"]["container"]
        self.fleet.docker("stop", services)
        try:
            self.fleet.sparkfleet("rollout", self.fleet.inventory, "--batch", "1", "--data", "max_model_len=65536",
                                  timeout=1200)
        finally:
            self.fleet.docker("start", services)
        super().restore()


class ControllerKilled(FleetCommand):
    def inject(self):
        rollout = subprocess.Popen([sys.executable, "-m", "sparkfleet", "rollout", self.fleet.inventory, "--batch",
                                    "1", "--data", "max_model_len=65536"], cwd=ROOT, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True, env=self.fleet.env)
        deadline = time.monotonic() + 600
        try:
            for line in iter(rollout.stderr.readline, ""):
                if (line.startswith("front door: ") and line.rstrip().endswith(" out")) or time.monotonic() > deadline:
                    break
        finally:
            os.killpg(rollout.pid, signal.SIGKILL)
            rollout.wait()
            rollout.stderr.close()
        self.fleet.converge(timeout=1200)  # the next command, as an operator runs it

    def restore(self):
        pass


class ModelRootFull(FleetCommand):
    """A tmpfs over the model root holding the running release with room for half a model more, a new commit
    on the hub, and a rollout: it must halt before any drain (tests/e2e/test_front_door.py's case, under load)."""

    def inject(self):
        from sparkfleet.contract import paths

        host = self.fleet.hosts[len(self.fleet.hosts) // 2]
        record = json.loads(self.fleet.sh(host, f"cat {shlex.quote(paths.RELEASE_FILE)}").stdout)
        running = record["model_dir"]
        root, copy = shlex.quote(os.path.dirname(running)), shlex.quote(running)
        self.small_host, self.root = host, root
        used = int(self.fleet.sh(host, f"du -sb {copy}").stdout.split()[0])
        self.lock_before = self.fleet.lock_bytes()
        run([sys.executable, "-m", "sim", "hub", "publish"], 300, check=True)
        self.fleet.sh(host, f"cp -a {copy} /tmp/soak-running && mount -t tmpfs -o size={used * 3 // 2} "
                            f"sparkfleet-soak-small {root} && mv /tmp/soak-running {copy}", timeout=300)
        self.fleet.sparkfleet("update", self.fleet.inventory, timeout=300)
        self.fleet.sparkfleet("rollout", self.fleet.inventory, "--batch", "1", timeout=1200)

    def restore(self):
        self.fleet.sh(self.small_host, f"umount {self.root} 2>/dev/null; true")
        if self.lock_before is not None:
            self.fleet.lock_path.write_bytes(self.lock_before)
        run([sys.executable, "-m", "sim", "hub", "unpublish"], 300)
        self.fleet.converge(timeout=1200)


IMPLEMENTATIONS: dict[str, Callable[[Fleet, str | None], Fault]] = {
    "engine-killed": EngineKilled, "engine-frozen": EngineFrozen, "frozen-after-restart": FrozenAfterRestart,
    "engine-hung": EngineHung, "docker-restarted": DockerRestarted, "host-rebooted": HostRebooted,
    "host-powered-off": HostPoweredOff, "door-network-cut": DoorNetworkCut, "shard-corrupted": ShardCorrupted,
    "model-root-full": ModelRootFull, "hub-registry-down": HubRegistryDown, "controller-killed": ControllerKilled,
    "rollout": Rollout, "upgrade": Upgrade, "door-lost": DoorLost,
}
assert set(IMPLEMENTATIONS) == set(soak.FAULTS)
NEEDS_A_COMMAND = {"shard-corrupted"}  # nothing watches a shard's bytes between converges: its repair is the plan


def run_fault(fleet: Fleet, slot: soak.Slot, started: float, faults: list[Fault]) -> soak.FaultResult:
    """One fault: wait for its time, inject, watch (every 2 s, up to its bound) for who noticed and for the host
    serving again, restore after its hold, repair at the bound."""
    spec = soak.FAULTS[slot.fault]
    time.sleep(max(0.0, started + slot.at_s - time.monotonic()))
    fault = IMPLEMENTATIONS[slot.fault](fleet, slot.host)
    faults.append(fault)
    result = soak.FaultResult(slot.fault, slot.host, injected=time.monotonic(), overlaps=slot.overlaps)
    wall = time.time()
    try:
        fault.inject()
    except (subprocess.SubprocessError, OSError, Refused) as exc:
        result.note = f"inject failed: {exc}"
    result.host = fault.host  # a door fault names the door it found holding the address
    if not spec.single_host and not fault.hold_s:  # a fleet command ran to its end inside inject
        fault.restore()
    restored = not fault.hold_s
    deadline = result.injected + spec.max_s
    if slot.fault in NEEDS_A_COMMAND:
        fault.repair()
        result.command, result.noticed_by, result.noticed = True, "converge", time.monotonic()
    while time.monotonic() < deadline:
        now = time.monotonic()
        if not restored and now >= result.injected + fault.hold_s:
            fault.restore()
            restored = True
        if result.noticed is None and (by := fault.noticed(wall)):
            result.noticed, result.noticed_by = time.monotonic(), by
        if result.serving_again is None and (restored or spec.door) and now > result.injected + 3 \
                and fault.serving():  # a door fault serves again (the other door) while the lost one is still off
            result.serving_again = time.monotonic()
        if result.serving_again is not None and restored:
            return result
        time.sleep(2)
    if not restored:
        fault.restore()
    fault.repair()
    result.command = True
    for _ in range(60):  # up to ~2 minutes more for the repaired host
        if fault.serving():
            result.serving_again = time.monotonic()
            break
        time.sleep(2)
    return result


def put_back(fleet: Fleet, faults: Sequence[Fault]) -> None:
    """Whatever a fault left (a paused engine, a hang knob, a stopped host, a route, the services): the fleet as
    the soak found it, whatever happened."""
    for fault in faults:
        try:
            fault.put_back()
        except (subprocess.SubprocessError, OSError, Refused):
            pass
    fleet.docker("start", fleet.state["services"]["container"])


def run_soak(inventory: str, names: Sequence[str], run_s: float, baseline_s: float, workers: int = 4) -> dict:
    """The whole soak on the simulated fleet: the soak's users on the door, the load with the schedule's faults,
    the readings afterwards; the door back on `inventory`'s users at the end. The report (soak.build_report)."""
    with tempfile.TemporaryDirectory(prefix="sparkfleet-soak-") as workdir:
        os.chmod(workdir, 0o700)
        fleet = Fleet(inventory, Path(workdir))
        skipped = [n for n in names if soak.FAULTS[n].door and len(fleet.doors) < 2]
        names = [n for n in names if n not in skipped]  # a door's loss needs a second door to take the address
        slots = soak.plan_schedule(names, fleet.hosts, run_s, baseline_s)
        fleet.write_inventory()
        keys = {user: fleet.add_user(user) for user in (*SOAK_USERS, THROWAWAY)}
        fleet.converge_door(whole=True)
        url, model, embedding = fleet.door_url_model()
        fleet.url, fleet.user_key = url, keys[SOAK_USERS[0]]
        records_before, lock_before = fleet.records(), fleet.lock_bytes()
        setting = fleet.settings[fleet.hosts[0]]
        bound = soak.heal_bound_s(setting.watchdog_interval_s, setting.watchdog_failures, START_S)
        log, faults, results, usage, missed = soak.RequestLog(), [], [], [], []
        load = soak.Load(url, model, {u: keys[u] for u in SOAK_USERS}, log, workers=workers,
                         embedding_model=embedding)
        started, wall = time.monotonic(), time.time()
        stop = threading.Event()

        from sparkfleet.controller.inventory import InventoryError  # pyinfra's CLI with it: imported where used

        def sample_usage():
            while not stop.wait(10):
                try:
                    usage.append((time.monotonic() - started, fleet.usage()))
                except InventoryError as exc:  # a sample missed, never the sampler: the note counts them
                    missed.append(str(exc))

        sampler = threading.Thread(target=sample_usage, daemon=True)
        sampler.start()
        threads = load.start(run_s)
        try:
            removed_at = started + soak.removal_at_s(slots, run_s, baseline_s)
            pool = []
            for slot in slots:
                thread = threading.Thread(target=lambda s=slot: results.append(run_fault(fleet, s, started, faults)),
                                          daemon=True)
                thread.start()
                pool.append(thread)
            time.sleep(max(0.0, removed_at - time.monotonic()))
            fleet.remove_user(THROWAWAY)
            fleet.converge_door()  # reloads the door: its usage counts go on from its snapshot (fleet/usage.py)
            for thread in pool:
                thread.join(max(1.0, started + run_s + 900 - time.monotonic()))
            for thread in threads:
                thread.join(soak.CLIENT_TIMEOUT_S * 4)
        finally:
            stop.set()
            load.stop.set()
            put_back(fleet, faults)
        sampler.join(15)
        usage.append((time.monotonic() - started, fleet.usage()))
        rolled = {f for f in names if not soak.FAULTS[f].single_host and not soak.FAULTS[f].door}
        statuses = {}
        for user, key in keys.items():
            try:
                statuses[user] = requests.post(f"{url}/v1/chat/completions", timeout=30,
                                               headers={"Authorization": f"Bearer {key}"},
                                               json={"model": model, "max_tokens": 1, "messages": [
                                                   {"role": "user", "content": "soak: still mine?"}]}).status_code
            except requests.RequestException as exc:
                statuses[user] = type(exc).__name__
        after = fleet.converge("--json", timeout=1800)
        try:
            changed = soak.converge_changes(after.stdout)
            changes = sum(len(ops) for ops in changed.values())
        except ValueError:
            changed, changes = {}, None
        checks = {"verified": fleet.rehash(),
                  "keys": soak.key_problems(statuses, removed={THROWAWAY}),
                  "usage": soak.usage_problems(usage),
                  "release records": soak.record_problems(records_before, fleet.records(),
                                                          rolled=set(fleet.hosts) if rolled else set()),
                  "lock": soak.lock_problems(lock_before, fleet.lock_bytes(), rolled=False),
                  "secrets": soak.secret_problems(fleet.journals(wall), {"api_key": fleet.api_key or "", **keys})}
        notes = [f"the converge afterwards changed: {host}: {', '.join(ops)}" for host, ops in sorted(changed.items())]
        if skipped:
            notes.append(f"not run ({', '.join(skipped)}): the inventory has one front door")
        if rolled:
            notes.append(f"fleet-wide changes ({', '.join(sorted(rolled))}) were put back before the checks")
        if missed:
            notes.append(f"{len(missed)} usage sample(s) missed (the inventory did not load), the first: {missed[0]}")
        fleet.converge_door(inventory=fleet.base)  # the door back on the inventory's own users
        fleet.close()
        return soak.build_report(log.snapshot(), sorted(results, key=lambda r: r.injected or 0), started=started,
                                 baseline_s=baseline_s, heal_bound=bound, serving_hosts=len(fleet.hosts),
                                 client_timeout_s=soak.CLIENT_TIMEOUT_S, checks=checks, converge_changes=changes,
                                 notes=notes)
