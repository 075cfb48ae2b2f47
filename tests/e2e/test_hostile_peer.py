"""Hostile model directories and peers, on the simulated fleet: a directory with a symlink and an extra
file converges to exactly the manifest (the share never serves the symlink's target), and an endless
peer is cut at the manifest's size."""

import json
import shlex
import time
import urllib.request

import pytest

from .conftest import HOSTS, converge, ssh

pytestmark = pytest.mark.e2e
REPO = "Qwen/Qwen3.5-35B-A3B-FP8"
SECRET = "TOP-SECRET-not-a-model-file"

# Run on a sim host: GET one path from a share with the fleet token (read from its 0600 file, never
# on a command line); print the status and whether the secret came back.
SHARE_GET = r"""
import sys, urllib.error, urllib.request
token = open("/etc/sparkfleet/fleet.token").read().strip()
request = urllib.request.Request(sys.argv[1], headers={"Authorization": "Bearer " + token})
try:
    body = urllib.request.urlopen(request, timeout=30).read()
    status = 200
except urllib.error.HTTPError as exc:
    body, status = exc.read(), exc.code
print(status, sys.argv[2].encode() in body)
"""

# A peer that streams zeros for ever, whatever is asked.
ENDLESS_PEER = r"""
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class Endless(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        try:
            while True:
                self.wfile.write(b"\0" * 65536)
        except OSError:
            pass
ThreadingHTTPServer(("127.0.0.1", 8099), Endless).serve_forever()
"""


def hub_files(hub) -> dict:
    return json.loads(urllib.request.urlopen(f"{hub}/_sim/repos").read())[REPO]["files"]


def release(state, host) -> dict:
    return json.loads(ssh(state, host, "cat /etc/sparkfleet/release.json"))


def share_get(state, host, url) -> tuple[int, bool]:
    out = ssh(state, host, f"python3 -c {shlex.quote(SHARE_GET)} {shlex.quote(url)} {SECRET}")
    status, leaked = out.split()
    return int(status), leaked == "True"


def listing(state, host, directory) -> list[str]:
    return sorted(ssh(state, host, f"find {shlex.quote(directory)} -mindepth 1 -printf '%y %P\\n'").splitlines())


def test_symlink_and_extras_converge_to_exactly_the_manifest(sim_fleet, hub, converged_fleet):
    host = HOSTS[1]
    container = next(h["container"] for h in sim_fleet["hosts"] if h["name"] == host)
    model_dir = release(sim_fleet, host)["model_dir"]
    q = shlex.quote(model_dir)
    ssh(sim_fleet, host, f"echo {SECRET} > /root/secret.txt && ln -s /root/secret.txt {q}/notes.txt && "
                         f"echo extra > {q}/extra.bin && mkdir {q}/olddir && ln -s /etc {q}/etc-link")
    # Even a record forged to vouch for the symlink's target does not make the share follow it.
    ssh(sim_fleet, host, "python3 -c " + shlex.quote(
        "import os, sys; sys.path.insert(0, '/opt/sparkfleet/bin'); from sparkfleet_host import verify as h; d = sys.argv[1]; "
        "r = h.read_record(d); r['notes.txt'] = {**h.stat_key(os.stat(d + '/notes.txt')), 'hash': '0' * 64}; "
        "h.write_record(d, r)") + f" {q}")
    share = f"http://{container}:8090/{model_dir.rsplit('/', 1)[1]}"
    assert share_get(sim_fleet, host, f"{share}/notes.txt") == (404, False)
    assert share_get(sim_fleet, host, f"{share}/etc-link/passwd") == (404, False)
    assert share_get(sim_fleet, host, f"{share}/config.json")[0] == 200  # the share itself works

    result = converge("--limit", host)
    assert result.returncode == 0, result.output[-3000:]
    assert any(name.startswith("Model ") for name in result.changed[host]), result.changed[host]
    expected = sorted([f"f {path}" for path in hub_files(hub)] + ["f .sparkfleet-verified.json"])
    assert listing(sim_fleet, host, model_dir) == expected
    assert ssh(sim_fleet, host, "cat /root/secret.txt") == SECRET  # the link went, never what it pointed at
    assert share_get(sim_fleet, host, f"{share}/notes.txt") == (404, False)
    ssh(sim_fleet, host, "rm -f /root/secret.txt")


def test_the_share_runs_unprivileged_on_the_lan_address_for_the_fleet_only(sim_fleet, converged_fleet):
    host = HOSTS[0]
    container = next(h["container"] for h in sim_fleet["hosts"] if h["name"] == host)
    user = ssh(sim_fleet, host, "ps -o user= -p $(systemctl show -p MainPID --value sparkfleet-share)")
    assert user and user != "root", user
    listen = ssh(sim_fleet, host, "ss -Hltn 'sport = :8090'")
    address = ssh(sim_fleet, host, f"getent hosts {container} | cut -d' ' -f1")
    assert listen.split()[3] == f"{address}:8090", listen
    assert ssh(sim_fleet, host, "stat -c '%a %U' /etc/sparkfleet/fleet.token") == "600 sparkfleet-share"
    model_dir = release(sim_fleet, host)["model_dir"].rsplit("/", 1)[1]
    no_token = ssh(sim_fleet, HOSTS[2], f"curl -s -o /dev/null -w '%{{http_code}}' "
                                         f"http://{container}:8090/{model_dir}/config.json")
    assert no_token == "401"


def test_an_endless_peer_is_cut_at_the_manifest_size(sim_fleet, hub, converged_fleet):
    host = HOSTS[2]
    name = release(sim_fleet, host)["model_dir"].rsplit("/", 1)[1]
    job = json.loads(ssh(sim_fleet, host, f"cat /var/lib/sparkfleet/manifests/{shlex.quote(name)}.json"))
    config = next(f for f in job["manifest"]["files"] if f["path"] == "config.json")
    job["manifest"]["files"] = [config]
    job.update(model_dir=f"/var/tmp/hostile-peer/{name}", staging_dir=f"/var/tmp/hostile-peer/.staging/{name}",
               peers=["http://127.0.0.1:8099/x"])
    ssh(sim_fleet, host, f"mkdir -p /var/tmp/hostile-peer && printf %s {shlex.quote(json.dumps(job))} > "
                         f"/var/tmp/hp.json && printf %s {shlex.quote(ENDLESS_PEER)} > /var/tmp/endless.py")
    ssh(sim_fleet, host, "setsid nohup python3 /var/tmp/endless.py >/dev/null 2>&1 < /dev/null & "
                         "echo $! > /var/tmp/endless.pid; "
                         "for i in $(seq 50); do ss -Hltn 'sport = :8099' | grep -q 8099 && break; sleep 0.1; done")
    try:
        started = time.monotonic()
        out = ssh(sim_fleet, host, "runtime=$(ls -d /opt/sparkfleet/runtime/runtime-* | grep -v tar.gz | tail -1); "
                                   "PYTHONPATH=$runtime timeout 120 python3 /opt/sparkfleet/bin/sparkfleet-fetch "
                                   "/var/tmp/hp.json --env-file /etc/sparkfleet/hub.env 2>&1")
        elapsed = time.monotonic() - started
        assert f"sent more than the manifest's {config['size']} bytes" in out, out
        assert json.loads(out.splitlines()[-1])["fetched"] == ["config.json"]  # then from the hub, verified
        assert elapsed < 60
        size = ssh(sim_fleet, host, f"stat -c %s /var/tmp/hostile-peer/{shlex.quote(name)}/config.json")
        assert int(size) == config["size"]
    finally:
        ssh(sim_fleet, host, "kill $(cat /var/tmp/endless.pid); rm -rf /var/tmp/hostile-peer /var/tmp/hp.json "
                             "/var/tmp/endless.py /var/tmp/endless.pid", check=False)
