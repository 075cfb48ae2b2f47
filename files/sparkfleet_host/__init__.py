"""What the hosts and the controller must agree on: a stdlib-only package (Python >= 3.10), one module a concern.

Shipped beside the helper scripts in /opt/sparkfleet/bin (contract/paths.py HOST_MODULE), which import its rooms
as a sibling package (`from sparkfleet_host.probes import ask`), and loaded by the controller from the same files
(sparkfleet/contract/shared.py). Import a name from the room that owns it; this package re-exports nothing.

- `verify`: the verified record of a model directory, the file hashes, and what a hub's answer may name.
- `envfiles`: the root-only env files (engine.env, hub.env): written, read, and edited by a rollback.
- `memory`: the memory plan's budget rule, its shares and its start order.
- `eviction`: which on-demand engine is stopped, least recently used first, to make room for a start.
- `docker`: a client of Docker's API socket (a container's id and addresses).
- `sockets`: who holds a TCP port (/proc), asked before a helper sends the engine its API key.
- `probes`: the serving file's probes, asked and judged.
- `backup`: a data host's backup (restic, SQLite's online backup), its record and metrics, the chat UI's restore.
- `cli`: `python3 sparkfleet_host ...` (its `__main__`): a model directory's state for testinfra, a rollback's
  env edit, each on-demand model's last request for `status`.

Rooms import downwards only: verify <- envfiles <- memory <- eviction <- docker <- sockets <- probes <- backup <- cli.
Host paths are passed in by the caller, never repeated here.
"""
