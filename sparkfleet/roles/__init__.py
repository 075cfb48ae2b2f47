"""Desired state of each role a host plays beside its engines, planned without a host: the guard in front of the
engines, the front door and its floating address, monitoring and the status page, the chat UI, the fleet CA's
certificates. Pure planning on top of `release/`; the stages in `tasks/` ensure what it plans, and `fleet/` reads
it when it talks to a live fleet."""
