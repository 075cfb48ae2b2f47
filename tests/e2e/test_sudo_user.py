"""A Spark reached as a user who is not root, as DGX OS's is: a simulated Spark given a login user the way
docs/prepare-a-spark.md prepares one (the sim's SSH key in its authorized_keys, sudo without a password by a
sudoers.d file checked with `visudo -cf`), converged over that user with pyinfra's `_sudo` (what
`sparkfleet init --ssh-user` writes): drift restored through sudo (a secret through its private 0700 directory),
then a no-op converge that costs the 2 SSH commands a root one does; `logs` and `doctor` read the host through sudo
too, and the root inventory's converge after it finds nothing to change. The sim's images stay as they are: the
user, and sudo itself (the sim's Debian has none), are added to the running container and removed after."""

from __future__ import annotations

import json
import shlex
import subprocess

import pytest

from sparkfleet.contract import paths
from tools.bench_converge import round_trips

from .conftest import HOSTS, ROOT, container, converge, sparkfleet, ssh, variant

pytestmark = pytest.mark.e2e

HOST = HOSTS[0]
USER = "nvidia"  # DGX OS's first user
SUDOERS = f"/etc/sudoers.d/sparkfleet-{USER}"
NOOP_SSH_COMMANDS = 2  # a converged Spark's no-op converge: the batched read and the serving check (docs/benchmarks.md)
DEBS = ROOT / ".sim" / "debs"  # sudo's package, fetched once by the controller's apt (the sim's Debian release)


def docker_exec(command: str, stdin: str | None = None) -> str:
    proc = subprocess.run(["docker", "exec", "-i", container(HOST), "sh", "-c", command], input=stdin,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{command}: exit {proc.returncode}: {proc.stderr}"
    return proc.stdout.strip()


def sudo_package() -> str:
    """sudo's .deb for the simulated Spark (Debian bookworm, the controller's arch), fetched once by apt."""
    DEBS.mkdir(parents=True, exist_ok=True)
    found = sorted(DEBS.glob("sudo_*.deb"))
    if not found:
        proc = subprocess.run(["apt-get", "download", "sudo"], cwd=DEBS, capture_output=True, text=True, timeout=300)
        found = sorted(DEBS.glob("sudo_*.deb"))
        assert found, f"the sim's Debian has no sudo and `apt-get download sudo` fetched none: {proc.stderr[-2000:]}"
    return str(found[-1])


@pytest.fixture
def sudo_user(converged_fleet):
    """USER on HOST, prepared as docs/prepare-a-spark.md says (sudo installed first where the host has none); then
    removed, and sudo with it where this fixture installed it."""
    had_sudo = subprocess.run(["docker", "exec", container(HOST), "dpkg-query", "-W", "-f=${Status}", "sudo"],
                              capture_output=True, text=True).stdout == "install ok installed"
    if not had_sudo:
        deb = sudo_package()
        subprocess.run(["docker", "cp", deb, f"{container(HOST)}:/tmp/sudo.deb"], check=True, timeout=120)
        docker_exec("DEBIAN_FRONTEND=noninteractive dpkg -i /tmp/sudo.deb >/dev/null && rm -f /tmp/sudo.deb")
    public_key = open(converged_fleet["ssh_key"] + ".pub").read()
    try:
        docker_exec(f"useradd --create-home --shell /bin/bash --password '*' {USER} && "
                    f"install -d -m 0700 -o {USER} -g {USER} /home/{USER}/.ssh && "
                    f"install -m 0600 -o {USER} -g {USER} /dev/stdin /home/{USER}/.ssh/authorized_keys", public_key)
        rule = f"{USER} ALL=(ALL) NOPASSWD:ALL\n"
        docker_exec(f"umask 0337 && cat > {SUDOERS}.new && visudo -cf {SUDOERS}.new >/dev/null && "
                    f"mv {SUDOERS}.new {SUDOERS}", rule)
        yield converged_fleet
    finally:
        docker_exec(f"rm -f {SUDOERS} {SUDOERS}.new; ! id {USER} >/dev/null 2>&1 || "
                    f"userdel --force --remove {USER} 2>/dev/null || true")
        if not had_sudo:
            # sudo's prerm refuses where root has no password (the sim's root has none) unless told
            docker_exec("SUDO_FORCE_REMOVE=yes DEBIAN_FRONTEND=noninteractive dpkg --purge sudo >/dev/null")
        assert docker_exec(f"id {USER} >/dev/null 2>&1 && echo still there || echo gone") == "gone"


def test_a_spark_converged_over_a_sudo_user_and_a_no_op_still_costs_two_ssh_commands(sudo_user, tmp_path):
    inventory = variant(tmp_path, "sudo-user", {}, {HOST: {"ssh_user": USER, "_sudo": True}})
    # prepared as the docs say: the user logs in with the key, is not root, and sudo asks it no password
    assert ssh_as_user(sudo_user, "id -un; sudo -n id -un") == f"{USER}\nroot"

    # drift only root could restore: the unit edited, the root-only engine environment (a secret) edited
    ssh(sudo_user, HOST, f"echo '# edited by hand' >> {paths.UNIT_PATH} && echo 'EDITED=1' >> {paths.ENGINE_ENV}")
    done = converge("--limit", HOST, inventory=inventory)
    assert done.returncode == 0, done.output[-4000:]
    assert {"Service | vLLM unit", "Service | Engine environment (root-only)"} <= set(done.changed[HOST]), \
        done.changed[HOST]
    assert ssh(sudo_user, HOST, f"stat -c '%U:%G %a' {paths.ENGINE_ENV}; grep -c 'EDITED\\|edited by hand' "
                                f"{paths.ENGINE_ENV} {paths.UNIT_PATH} || true").splitlines() == \
        ["root:root 600", f"{paths.ENGINE_ENV}:0", f"{paths.UNIT_PATH}:0"]
    # the secret went through a directory only the login user could enter, removed after: nothing of the user's
    # is left in /tmp, and no file there holds the key (pyinfra's own staging, /tmp/pyinfra-<sha1>, is not used)
    assert ssh(sudo_user, HOST, f"find /tmp /var/tmp -user {USER} 2>/dev/null; grep -rl sim-key /tmp /var/tmp "
                                "2>/dev/null || true") == ""

    again = converge("--limit", HOST, "-vv", inventory=inventory)
    assert again.returncode == 0 and again.changed[HOST] == [], again.changed[HOST]
    assert round_trips(again.output) == NOOP_SSH_COMMANDS, _echoed(again.output)
    assert all(">>> sudo -H -n " in line for line in _sent(again.output)), _echoed(again.output)  # escalated

    # what else reads a host through the inventory: the journal (root's) by `logs`, the checks of `doctor`
    logs = sparkfleet("logs", inventory, HOST, "-n", "5", timeout=120)
    assert logs.returncode == 0 and logs.stdout.strip(), logs.stderr[-2000:]
    assert "insufficient permissions" not in logs.stdout + logs.stderr
    doctor = sparkfleet("doctor", inventory, "--limit", HOST, "--json", timeout=300)
    checks = json.loads(doctor.stdout)["hosts"][0]["checks"]
    assert checks["user"] == {"cell": f"{USER} (sudo)", "problem": None, "fix": None}, checks
    assert checks["docker"]["problem"] is None, checks  # Docker's socket is root's: asked through sudo

    # what the sudo user wrote is what root writes (root:root, the same modes): the root inventory's no-op converge
    # changes nothing and costs the same
    root = converge("--limit", HOST, "-vv")
    assert root.returncode == 0 and root.changed[HOST] == [], root.changed[HOST]
    assert round_trips(root.output) == NOOP_SSH_COMMANDS, _echoed(root.output)


def ssh_as_user(state: dict, command: str) -> str:
    """`command` on HOST over real SSH as USER, with the sim's key."""
    port = next(h["ssh_port"] for h in state["hosts"] if h["name"] == HOST)
    proc = subprocess.run(["ssh", "-i", state["ssh_key"], "-p", str(port), "-o", "StrictHostKeyChecking=no",
                           "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes",
                           "-o", "ConnectTimeout=10", f"{USER}@127.0.0.1", command],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{shlex.quote(command)} as {USER}: exit {proc.returncode}: {proc.stderr}"
    return proc.stdout.strip()


def _sent(output: str) -> list[str]:
    """The SSH commands a `-vv` converge echoed ("[host] >>> command"), as tools/bench_converge.py counts them."""
    return [line for line in output.splitlines() if "] >>> " in line]


def _echoed(output: str) -> str:
    """The start of each SSH command a `-vv` converge echoed, for a failure's message."""
    return "\n".join(line[:300] for line in _sent(output))
