"""The front door: one HAProxy in front of the fleet's engines, built from the inventory. What a door host is meant
to hold (its plan, floating address, holds and records) is planned in roles/front_door/; this package is what the
controller does with a live door, in rooms of one concern each (import a name from the room that owns it; this
package re-exports nothing):

- `runtime`: what the controller asks a front door host over SSH and reads back (`states_command`, `backend_states`,
  `in_rotation`, the door survey, ...; `FrontDoorRuntime`, which the one batch loop of rollout, upgrade and rollback
  drives); the commands that write the drain and hold records are roles/front_door/records.py's.
- `commands`: the front door's commands (`drain_host`, `undrain_host`, `front_door_status`, `status_rows`,
  `bench_target`); where the controller reaches a door is contract/reach.py `front_door_url`.

Rooms import downwards only: runtime <- commands. The inventory's front door hosts are
`controller/inventory.py` `group_hosts(inventory, contract.monitoring.FRONT_DOOR_GROUP)`.

HAProxy (Debian's package) rather than a proxy of our own: per-user keys are a map file, health routing is its
checks (a one-token chat completion, since a wedged engine still answers /health), cache affinity is `balance
hash` on the conversation with consistent hashing, and drain is its runtime API. Its backends are the hosts'
guards (roles/guard.py), asked with the engines' key; a user's key reaches only the OpenAI paths the fleet serves
(roles/haproxy.py `API_PATHS`). The plain parts (config, maps, reading its state) are functions; the runtime
calls go over SSH to the front door hosts, through pyinfra like every other command.
"""
