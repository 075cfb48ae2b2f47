"""Stage 8 (the host of the group chat_ui, after the front doors): the chat UI, Open WebUI in Docker on loopback
(sparkfleet/roles/chat_ui.py says who signs in and how, and what its host holds: `chat_ui_state`).

Its data (chats, settings) lives in a directory of the host's that no converge, restart or version change removes.
A version change stops it, keeps its database as `backups/webui.db.<old digest>` and, going back to a version it
left before (a rollback), puts that version's copy back: the newer version's database stays in its own copy.
A host that leaves the group has its container and settings removed; its data stays.
"""

from pyinfra import host
from pyinfra.api import deploy

from sparkfleet.host.facts import JsonFile
from sparkfleet.host.state import fact
from sparkfleet.release.image import ImagePin
from sparkfleet.release.plan import HostPlan
from sparkfleet.roles.chat_ui import IMAGE_RECORD, ChatUi, chat_ui_state, no_chat_ui_state
from sparkfleet.tasks.ensure import ensure


@deploy("Chat UI")
def chat_ui(plan: HostPlan, doors: list[HostPlan], ui: ChatUi, pin: ImagePin):
    # the digest it runs now, as recorded: what a version change moves from
    ensure(chat_ui_state(ui, doors, pin, plan.settings.served_model_name, fact(host, JsonFile, path=IMAGE_RECORD)))


@deploy("No chat UI")
def no_chat_ui():
    """A host outside the group chat_ui runs no chat UI: one it ran before is stopped and its unit and settings
    removed. Its data directory stays (people's chats: an office removes it by hand, or moves it)."""
    ensure(no_chat_ui_state())
