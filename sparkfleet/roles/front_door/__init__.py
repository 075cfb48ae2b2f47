"""What a front door host is meant to hold, planned without a host (the fleet's runtime of it: fleet/front_door/):

- `holds`: who set a backend aside for a change and whether that operation still runs.
- `records`: the drain and hold records and HAProxy's runtime socket: the commands that write and replay them.
- `address`: two or more doors as one set (the floating address, VRRP, the peers, keepalived's config).
- `plan`: what a front door host serves and the contents of its files (`front_door_plan`, `FrontDoor`).
- `desired`: what a front door host holds, as its stage ensures it (`door_state`; `no_door_state` elsewhere).

Rooms import downwards only: holds <- records <- address <- plan <- desired.
"""
