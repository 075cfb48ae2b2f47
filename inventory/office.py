"""An example office fleet: three DGX Sparks on the LAN.

Every module-level list is a pyinfra group; hosts are ("name", {data}).
Settings (see group_data/all.py) can be given per host here, per group in
group_data/<group>.py, or per run with `--data key=value`.
"""

sparks = [
    ("spark-a", {"ssh_hostname": "spark-a.lan", "ssh_user": "root"}),
    ("spark-b", {"ssh_hostname": "spark-b.lan", "ssh_user": "root"}),
    ("spark-c", {"ssh_hostname": "spark-c.lan", "ssh_user": "root"}),
]
