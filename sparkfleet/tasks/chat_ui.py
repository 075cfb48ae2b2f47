"""Stage 8 (the host of the group chat_ui, after the front doors): the chat UI, Open WebUI in Docker on loopback
(sparkfleet/roles/chat_ui.py says who signs in and how).

Its data (chats, settings) lives in a directory of the host's that no converge, restart or version change removes.
A version change stops it, keeps its database as `backups/webui.db.<old digest>` and, going back to a version it
left before (a rollback), puts that version's copy back: the newer version's database stays in its own copy.
A host that leaves the group has its container and settings removed; its data stays.
"""

import json

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import server

from sparkfleet.contract import paths
from sparkfleet.roles import chat_ui as ui_rules
from sparkfleet.roles.chat_ui import ChatUi
from sparkfleet.host.facts import JsonFile
from sparkfleet.host.managed import managed_absent, managed_directory, managed_file, managed_unit
from sparkfleet.host.operations import secret_file
from sparkfleet.host.state import fact
from sparkfleet.release.image import ImagePin
from sparkfleet.release.plan import HostPlan
from sparkfleet.tasks.service import unit_removed

IMAGE_RECORD = f"{paths.CHAT_UI_DIR}/image.json"  # the digest the unit runs: what a version change moves from
START_WAIT_S = 300  # a first start on a small box: Open WebUI's imports and its database's migrations


@deploy("Chat UI")
def chat_ui(plan: HostPlan, doors: list[HostPlan], ui: ChatUi, pin: ImagePin):
    managed_directory(name="Chat UI directory (root-only)", path=paths.CHAT_UI_DIR, mode="0700")
    managed_directory(name="Chat UI data (chats and settings; kept across versions)", path=paths.CHAT_UI_DATA,
                      mode="0700")
    door = ui_rules.door_endpoint(doors)
    env = secret_file(name="Chat UI settings and secrets (root-only)", dest=paths.CHAT_UI_ENV,
                      content=ui_rules.env_file(ui, door, plan.settings.served_model_name))
    ca = (managed_file(name="The door's certificate, which the chat UI trusts", src=door.ca,
                       dest=paths.CHAT_UI_DOOR_CA, mode="0644") if door.ca else
          managed_absent(name=f"{paths.CHAT_UI_DOOR_CA} absent (the door's certificate: none needed)",
                         path=paths.CHAT_UI_DOOR_CA))
    record = _json(fact(host, JsonFile, path=IMAGE_RECORD))
    move = ui_rules.version_change_command(record.get("digest"), pin.digest)
    if move:
        server.shell(name=f"Chat UI's database kept before its version changes ({paths.CHAT_UI_BACKUPS})",
                     commands=[move])
    unit = managed_file(name="Chat UI unit", content=ui_rules.unit(ui, pin.ref, door_ca=bool(door.ca)),
                        dest=paths.CHAT_UI_UNIT_PATH, mode="0644")
    started = managed_unit(name="Chat UI enabled and running", service=paths.CHAT_UI_UNIT_NAME, running=True,
                           enabled=True, restarted=unit.will_change or env.will_change or ca.will_change,
                           daemon_reload=unit.will_change)
    managed_file(name="Chat UI's image recorded", content=json.dumps({"digest": pin.digest, "ref": pin.ref}) + "\n",
                 dest=IMAGE_RECORD, mode="0644")
    if started.will_change or unit.will_change or env.will_change or ca.will_change:
        url = f"http://127.0.0.1:{ui.local_port}{ui_rules.HEALTH}"
        server.shell(name=f"Chat UI answers on loopback port {ui.local_port}", commands=[
            f"for i in $(seq {START_WAIT_S}); do curl -fs --max-time 5 -o /dev/null {url} && exit 0; sleep 1; done; "
            f"echo 'the chat UI did not answer within {START_WAIT_S}s: journalctl -u {paths.CHAT_UI_UNIT_NAME}' >&2; "
            "exit 1"])


@deploy("No chat UI")
def no_chat_ui():
    """A host outside the group chat_ui runs no chat UI: one it ran before is stopped and its unit and settings
    removed. Its data directory stays (people's chats: an office removes it by hand, or moves it)."""
    why = f"this host is not in the group {paths.CHAT_UI_GROUP}"
    unit_removed(paths.CHAT_UI_UNIT_NAME, paths.CHAT_UI_UNIT_PATH, why)
    for path in (paths.CHAT_UI_ENV, paths.CHAT_UI_DOOR_CA):
        managed_absent(name=f"{path} removed ({why})", path=path)


def _json(text: str | None) -> dict:
    try:
        found = json.loads(text) if text else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}
