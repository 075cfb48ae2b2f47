"""A host that says odd things, and secrets that must not leak, on the simulated fleet:
`--diff` shows no secret, a keyring with an extra key is replaced by the one key, a corrupt
release record stops the host before anything is removed, and a rollback's gate asks the
address the previous release served on."""

import base64
import json
import os
import subprocess
import time

import pytest

from .conftest import ROOT, converge, sparkfleet, ssh, variant

pytestmark = pytest.mark.e2e

KEYRING = "/etc/apt/keyrings/nvidia-container-toolkit.gpg"
RECORD = "/etc/sparkfleet/release.json"


def pyinfra(inventory: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / ".venv/bin/pyinfra"), inventory, "deploy.py", *args], cwd=ROOT, check=False,
                          capture_output=True, text=True, timeout=timeout)


def test_diff_with_a_rotated_api_key_and_hub_token_shows_neither_secret(sim_fleet, converged_fleet, tmp_path):
    rotated = variant(tmp_path, "rotated", {"api_key": "sk-rotated-7c1d", "hub_token": "hf_rotated_9e2b"})
    proc = pyinfra(rotated, "--dry", "--diff", "--limit", "spark-1")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "Engine environment (root-only)" in output and "Hub token (root-only)" in output
    for secret in ("sim-key", "sk-rotated-7c1d", "hf_rotated_9e2b"):
        assert secret not in output, f"{secret} printed by pyinfra --diff"


def two_key_keyring(tmp_path, fingerprint: str) -> bytes:
    """The sim's toolkit key plus a key of our own, in one binary keyring."""
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    env = {**os.environ, "GNUPGHOME": str(home)}

    def gpg(*args, stdin=None):
        return subprocess.run(["gpg", "--batch", "--quiet", *args], env=env, input=stdin, capture_output=True,
                              check=True).stdout

    gpg("--passphrase", "", "--quick-gen-key", "Mirror <mirror@lan>", "ed25519", "sign", "never")
    sim_key = subprocess.run(["gpg", "--homedir", str(ROOT / ".sim/apt/gnupg"), "--batch", "--export", fingerprint],
                             capture_output=True, check=True).stdout
    gpg("--import", stdin=sim_key)
    return gpg("--export")


def primary_keys(state, host: str) -> list[str]:
    listing = ssh(state, host, f"gpg --show-keys --with-colons {KEYRING}")
    lines = listing.splitlines()
    return [lines[i + 1].split(":")[9] for i, line in enumerate(lines[:-1]) if line.startswith("pub:")]


def test_a_keyring_holding_a_second_key_is_replaced_by_the_configured_key_alone(sim_fleet, converged_fleet, tmp_path):
    fingerprint = sim_fleet["apt"]["key_fingerprint"]
    blob = base64.b64encode(two_key_keyring(tmp_path, fingerprint)).decode()
    ssh(sim_fleet, "spark-1", f"echo {blob} | base64 -d > {KEYRING}")
    assert len(primary_keys(sim_fleet, "spark-1")) == 2
    result = converge("--limit", "spark-1")
    assert not result.host_failed("spark-1"), result.output[-3000:]
    assert "NVIDIA Container Toolkit | Toolkit signing key (fingerprint checked)" in result.changed["spark-1"]
    assert primary_keys(sim_fleet, "spark-1") == [fingerprint]


def test_a_corrupt_release_record_stops_the_host_and_every_model_stays(sim_fleet, converged_fleet):
    models = ssh(sim_fleet, "spark-1", "ls /var/lib/sparkfleet/models")
    record = ssh(sim_fleet, "spark-1", f"cat {RECORD}")
    stale = "/var/lib/sparkfleet/models/Old--Model@0000000000000000000000000000000000000000"
    ssh(sim_fleet, "spark-1", f"mkdir -p {stale} && echo '{{ \"release_id\": ' > {RECORD}")
    try:
        proc = pyinfra("inventory/sim.py", "-y", "--limit", "spark-1")
        assert proc.returncode != 0
        assert (f"spark-1: {RECORD}: not valid JSON (Expecting value: line 1 column 17 (char 16)): "
                "fix or remove it by hand; sparkfleet changes nothing on doubt") in proc.stderr
        assert ssh(sim_fleet, "spark-1", "ls /var/lib/sparkfleet/models") == "\n".join(
            sorted([*models.splitlines(), stale.rsplit("/", 1)[1]]))
        assert ssh(sim_fleet, "spark-1", f"cat {RECORD}") == '{ "release_id":'
    finally:
        encoded = base64.b64encode(record.encode()).decode()
        ssh(sim_fleet, "spark-1", f"echo {encoded} | base64 -d > {RECORD} && rm -rf {stale}")
    assert not converge("--limit", "spark-1").host_failed("spark-1")


def test_rollback_on_a_host_serving_on_its_lan_address_passes_its_gate_in_seconds(sim_fleet, converged_fleet,
                                                                                 tmp_path):
    lan = ssh(sim_fleet, "spark-1", "hostname -I").split()[0]
    on_lan = {"api_host": lan, "health_timeout_s": 600}
    first = variant(tmp_path, "lan-a", {**on_lan, "max_model_len": 32768})
    second = variant(tmp_path, "lan-b", {**on_lan, "max_model_len": 16384})
    try:
        for inventory in (first, second):
            proc = pyinfra(inventory, "-y", "--limit", "spark-1")
            assert proc.returncode == 0, proc.stderr[-3000:]
        kept = json.loads(ssh(sim_fleet, "spark-1", "cat /etc/sparkfleet/previous/release.json"))
        assert (kept["api_host"], kept["health_timeout_s"], kept["tools"]) == (lan, 600, True)
        started = time.monotonic()
        proc = sparkfleet("rollback", "inventory/sim.py", "--limit", "spark-1", "--json")
        seconds = time.monotonic() - started
        assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
        assert seconds < 120, f"rollback took {seconds:.0f} s"
        assert json.loads(ssh(sim_fleet, "spark-1", f"cat {RECORD}"))["release_id"] == kept["release_id"]
        served = ssh(sim_fleet, "spark-1", f"curl -s -H 'Authorization: Bearer sim-key' http://{lan}:8000/v1/models")
        assert json.loads(served)["data"][0]["max_model_len"] == 32768
    finally:
        assert not converge("--limit", "spark-1").host_failed("spark-1")
