"""Desired state of each role a host plays beside its engines, planned without a host: the guard in front of the
engines, the front door and its floating address, monitoring and the status page, the chat UI, the fleet CA's
certificates. Pure planning on top of `release/`; the stages in `tasks/` ensure what it plans, and `fleet/` reads
it when it talks to a live fleet.

Each role's planner returns one `DesiredState` (desired.py) for a host: `guard.guard_state`, `pki.tls_state`,
`front_door.desired.door_state`, `monitoring.monitoring_state` and `node_metrics_state`, `chat_ui.chat_ui_state`.
Its stage hands it to `tasks/ensure.py` `ensure`, one pass; what a planner needs of a host, the stage reads first
and passes in."""
