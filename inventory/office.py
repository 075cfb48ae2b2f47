"""An example office fleet: three DGX Sparks on the LAN.

Every module-level list is a pyinfra group; hosts are ("name", {data}).
Settings (see group_data/all.py) can be given per host here, per group in
group_data/<group>.py, or per run with `--data key=value`.

Host keys are checked strictly against inventory/known_hosts: pyinfra's
default (`accept-new`) trusts whatever key answers the first connection, and
overrides `StrictHostKeyChecking yes` in ~/.ssh/config, so a first run could
hand `api_key` and `hub_token` to a machine in the middle. Collect each
Spark's key once and compare it with the console (docs/ssh-host-keys.md).
"""

from pathlib import Path as _Path

_ssh = {
    "ssh_user": "root",
    "ssh_strict_host_key_checking": "yes",
    "ssh_known_hosts_file": str(_Path(__file__).with_name("known_hosts")),
}

sparks = [
    ("spark-a", {"ssh_hostname": "spark-a.lan", **_ssh}),
    ("spark-b", {"ssh_hostname": "spark-b.lan", **_ssh}),
    ("spark-c", {"ssh_hostname": "spark-c.lan", **_ssh}),
]
