"""The example office fleet (inventory/office.py) with one front door for everyone: https://llm.lan:8080/v1.

HAProxy runs on two of the Sparks (group `front_door`), each in front of all
three engines. Give clients one name with both addresses (DNS: two A records
for llm.lan -> spark-a, spark-b): the OpenAI clients retry a refused
connection (max_retries, 2 by default) and the resolver hands out the other
address, so either front door can be down. Each person gets their own key;
the engines' api_key is known only to the front doors (and this controller's
status/bench), so a client cannot go around the front door with a user key.
Keep the keys out of this file: read them from a file only you can read.
"""

import json as _json
import runpy as _runpy
from pathlib import Path as _Path

_office = _runpy.run_path(str(_Path(__file__).with_name("office.py")))  # the same three Sparks, SSH settings

# {"api_key": "...", "users": {"alice": "...", ...}}: chmod 600, outside the repository
_secrets = _json.loads((_Path.home() / ".config" / "sparkfleet" / "office-keys.json").read_text())

_serving = {
    "api_host": "0.0.0.0",  # reached by the front doors over the LAN...
    "api_key": _secrets["api_key"],  # ...with the key only they hold
    "front_door_users": _secrets["users"],
    "front_door_tls_cert": str(_Path.home() / ".config" / "sparkfleet" / "llm.lan.crt"),
    "front_door_tls_key": str(_Path.home() / ".config" / "sparkfleet" / "llm.lan.key"),
    # the fleet CA (`sparkfleet init` makes it beside the secrets): TLS on every hop from a front door to a guard,
    # so the engines' key never crosses the LAN in clear; its key stays on this controller (0600)
    "fleet_ca_cert": str(_Path.home() / ".config" / "sparkfleet" / "office-keys.ca.crt"),
    "fleet_ca_key": str(_Path.home() / ".config" / "sparkfleet" / "office-keys.ca.key"),
}

sparks = [(name, {**data, **_serving}) for name, data in _office["sparks"]]
front_door = sparks[:2]
