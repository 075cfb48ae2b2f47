"""The simulated fleet as `make demo` leaves it (inventory/sim_two_doors.py: two doors sharing one address, TLS on
every hop to a guard) with a chat UI for colleagues: Open WebUI on spark-1 (the group chat_ui), reached only
through the doors' port 3000, where each person signs in with their own key; spark-3 keeps the chat UI's and the
doors' backups (the group backup). Its image is built from Open WebUI's
PyPI release into the sim's registry (the official one cannot be pulled here): `python -m sim chat-ui` first
(minutes and ~3 GB the first time).

    python -m sim up --service-hosts 2
    python -m sim chat-ui
    pyinfra inventory/sim_chat_ui.py deploy.py

This machine reaches the floating address over the Docker bridge: http://<floating address>:3000/ (`make demo`
prints it).
"""

import runpy as _runpy
from pathlib import Path as _Path

_two = _runpy.run_path(str(_Path(__file__).resolve().parent / "sim_two_doors.py"))
_state = _two["_state"]
# the sim's registry holds the image `python -m sim chat-ui` built; its tag is pinned by digest in the lock
_ui = {"chat_ui_image": "sparkfleet-registry:5000/open-webui/open-webui:v0.12.4"}

sparks = [(_name, {**_data, **_ui}) for _name, _data in _two["sparks"]]
front_door = [(_name, {**_data, **_ui}) for _name, _data in _two["front_door"]]
monitoring = _two["monitoring"]
chat_ui = [sparks[0][0]]
# the backup target (docs/backups.md): a Spark that is not the chat UI's; the doors hold data of their own
backup = [sparks[2][0]]
