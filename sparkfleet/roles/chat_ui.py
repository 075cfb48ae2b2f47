"""The chat UI: Open WebUI on the host of the inventory group `chat_ui`, for colleagues who chat in a browser.

Who a person is, is decided at the front door, never by Open WebUI:
- A browser signs in at the door's chat port with the person's own key (the sign-in page is the door's). The door
  keeps it in an HttpOnly cookie (`__Host-` over TLS: cookie_name), sets and clears it only for a form of its own
  page (never one another site's page sent, nor a GET), refuses a request naming it twice, checks it against the
  users' map on every request, strips it before Open WebUI, and tells Open WebUI who is asking (and where from:
  X-Forwarded-For and -Proto) in headers it sets itself (any a client sent are dropped). Open WebUI makes the
  account on first sight (`WEBUI_AUTH_TRUSTED_EMAIL_HEADER`), with no sign-up and no password of its own. Its own
  "Sign out" leads to the door's sign-out page (`WEBUI_AUTH_SIGNOUT_REDIRECT_URL`). A removed user's key stops
  opening it at the converge that removes them; a rotated key is a new sign-in to the same account (same chats).
- Open WebUI's own requests to the models come back through the door's API with a key of its own (derived, below)
  and a JWT naming the person (`FORWARD_USER_INFO_HEADER_JWT_SECRET`, HS256, 5 minutes). The door verifies it
  (`jwt_verify`) and counts and limits the request as that person's; the UI's key with no valid token reaches
  nothing but the model list.
- Open WebUI listens on no port: only on a unix socket in a directory of the guard's chroot (root:haproxy 0710,
  mounted into its container alone), so no local process, engine or other user of its host reaches it (its host's
  network is the engines'). The doors reach it through its host's guard, which wants the engines' key in a header of
  its own (Open WebUI uses Authorization for its sessions), so no other LAN host can speak for the door. What
  reaches the socket is the guard, so Open WebUI trusts the forwarded headers there (the door is their only author).

Its secrets (the UI's key, the signing secret, its session secret) are derived from the engines' api_key (HMAC):
nothing new to keep, and a new api_key renews them all. They reach Open WebUI in a 0600 file its shell reads at
start, never its command line or `docker inspect`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import shlex
from dataclasses import dataclass

from sparkfleet.contract import paths
from sparkfleet.contract.paths import engine_port
from sparkfleet.contract.reach import http_url
from sparkfleet.contract.settings import Settings, SettingsError
from sparkfleet.roles import haproxy
from sparkfleet.roles.desired import (Absent, Command, DesiredState, Directory, File, HttpWait, Unit, UnitRemoved,
                                      desired, secret)
from sparkfleet.release import render
from sparkfleet.release.image import ImagePin
from sparkfleet.release.plan import HostPlan

# What the door's users map names the chat UI's key: no user can be called this (a Name starts with a letter or
# digit), and the door never counts a request under it but the model list's.
UI_USER = "@chat-ui"
# The domain of the accounts' e-mail addresses: `<user>@` it (RFC 2606's: never a real mailbox).
EMAIL_DOMAIN = "sparkfleet.invalid"
# The headers the door sets for Open WebUI (and drops from clients), and the one Open WebUI signs
EMAIL_HEADER, NAME_HEADER, ROLE_HEADER = "X-Sparkfleet-User-Email", "X-Sparkfleet-User-Name", "X-Sparkfleet-User-Role"
DOOR_HEADER = "X-Sparkfleet-Door"  # the engines' key, from the door to the UI's guard
JWT_HEADER = "X-OpenWebUI-User-Jwt"
JWT_ENV = "SPARKFLEET_CHAT_UI_JWT"  # what the door's secrets file sets, which its config's jwt_verify reads
COOKIE = "sparkfleet_key"  # over TLS, with the prefix __Host- (cookie_name)
LOGIN_PATH, LOGOUT_PATH = "/sparkfleet/login", "/sparkfleet/logout"
HEALTH = "/health"  # Open WebUI's own
IMAGE_DATA = "/app/backend/data"  # where the official image keeps its data
ENV_IN_CONTAINER = "/run/sparkfleet-chat-ui.env"
CA_IN_CONTAINER = "/run/sparkfleet-chat-ui-door-ca.pem"
SOCKET_DIR_IN_CONTAINER = "/run/sparkfleet-chat-ui"  # paths.CHAT_UI_SOCKET_DIR, mounted
SOCKET_IN_CONTAINER = f"{SOCKET_DIR_IN_CONTAINER}/{paths.CHAT_UI_SOCKET.rpartition('/')[2]}"


@dataclass(frozen=True)
class ChatUi:
    """The chat UI of an inventory: its host, where the doors reach it (the host's guard), its image."""

    host: str
    address: str  # the host's LAN address: the doors' server line
    settings: Settings  # its host's
    tls: bool = False  # the guards serve TLS (the door presents its certificate)

    @property
    def target(self) -> str:
        return haproxy.address(self.address, self.settings.chat_ui_host_port)


def chat_ui_plan(names: list[str], plans: dict[str, HostPlan]) -> ChatUi | None:
    """The inventory's chat UI (`names`: the group chat_ui), or None; SettingsError naming each problem."""
    if not names:
        return None
    problems = []
    if len(names) > 1:
        problems.append(f"group {paths.CHAT_UI_GROUP}: {', '.join(names)}: one host runs the chat UI (its chats live "
                        "there): keep one")
    plan = plans[names[0]]
    s = plan.settings
    if plan.is_service:
        problems.append(f"{plan.name}: group {paths.CHAT_UI_GROUP} needs a host with Docker (a Spark); a service "
                        "host runs none: put a Spark in the group")
    taken = {"api_port": s.api_port, "peer_port": s.peer_port, **{f"service {n}'s api_port": v.api_port
                                                                   for n, v in s.services.items()}}
    for what, port in taken.items():
        if s.chat_ui_host_port in (port, engine_port(port)):
            problems.append(f"{plan.name}: setting `chat_ui_host_port` = {s.chat_ui_host_port} collides with {what} "
                            f"{port}: pick another port")
    if not s.api_key:
        problems.append(f"{plan.name}: setting `api_key` is missing: the chat UI's secrets are derived from it")
    emails: dict[str, str] = {}
    for name in s.front_door_users:
        if emails.setdefault(email(name), name) != name:
            problems.append(f"{plan.name}: users {emails[email(name)]!r} and {name!r} differ only in case: the chat "
                            "UI's accounts would be one; rename one")
    if problems:
        raise SettingsError(problems)
    return ChatUi(plan.name, plan.lan_address, s, plan.backend_tls)


def door_problems(door_host: str, s: Settings, ui: ChatUi) -> list[str]:
    """What a front door host cannot do for the chat UI (its port taken by its own API or peers)."""
    ports = {"front_door_port": s.front_door_port, "front_door_peers_port": s.front_door_peers_port,
             "monitoring_port": s.monitoring_port}
    return [f"{door_host}: setting `chat_ui_port` = {s.chat_ui_port} is `{k}` too: pick another port"
            for k, v in ports.items() if v == s.chat_ui_port]


def derived(api_key: str, purpose: str) -> str:
    """A secret of the chat UI's, from the engines' key: HMAC-SHA256, URL-safe (a UserKey, a cookie and a shell
    word as it is)."""
    mac = hmac.new(api_key.encode(), f"sparkfleet chat-ui {purpose}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).decode().rstrip("=")


def cookie_name(tls: bool) -> str:
    """The door's cookie, as its config names it: over TLS `__Host-` prefixed, which a browser keeps only Secure,
    for Path=/ and without a Domain, so no page of a neighbouring site (another subdomain) can set one beside it."""
    return f"__Host-{COOKIE}" if tls else COOKIE


def ui_key(api_key: str) -> str:
    return derived(api_key, "key")


def jwt_secret(api_key: str) -> str:
    return derived(api_key, "jwt")


def email(user: str) -> str:
    """A user's account in Open WebUI (which lower-cases addresses)."""
    return f"{user}@{EMAIL_DOMAIN}".lower()


def users_map(users: list[str]) -> str:
    """The door's "<email> <user>" map: who a verified token names, only while they are a user."""
    return "".join(f"{email(u)} {u}\n" for u in sorted(users))


def door_secrets(api_key: str) -> str:
    """The door's secrets file (0600), read before its config: the signing secret in HAProxy's environment."""
    return (f"# Managed by sparkfleet: the chat UI's signing secret (0600)\nglobal\n"
            f"    setenv {JWT_ENV} {jwt_secret(api_key)}\n")


@dataclass(frozen=True)
class DoorEndpoint:
    """Where Open WebUI asks the models, and the certificate it trusts there (a PEM on the controller), if any."""

    url: str
    ca: str | None = None


def door_endpoint(door_plans: list[HostPlan]) -> DoorEndpoint:
    """The doors' shared address, else the first door, on its API port; over https, the door's
    `controller_front_door_ca` (`sparkfleet init` sets it to the door's own self-signed certificate) is what Open
    WebUI trusts, or, unset, the image's own CAs (a certificate of a public CA)."""
    first = door_plans[0]
    s = first.settings
    address = s.front_door_address.split("/")[0] if s.front_door_address else first.lan_address
    tls = bool(s.front_door_tls_cert)
    return DoorEndpoint(f"{http_url(address, s.front_door_port, 'https' if tls else 'http')}/v1",
                        s.controller_front_door_ca if tls else None)


def env_file(ui: ChatUi, door: DoorEndpoint, default_model: str) -> str:
    """Open WebUI's settings and secrets as its shell reads them (`set -a; . FILE`): every value one quoted word.
    Its config is read from here at every start (no persistent config), sign-up off, accounts by the door's
    header only, no calls home, no background generations (each would be a request counted as the person's)."""
    s = ui.settings
    values = {
        "DATA_DIR": IMAGE_DATA,
        "WEBUI_SECRET_KEY": derived(s.api_key, "session"),
        "ENABLE_PERSISTENT_CONFIG": "False",
        "ENABLE_SIGNUP": "False",
        "ENABLE_LOGIN_FORM": "False",
        # its own "Sign out" ends on the door's sign-out page, whose button signs the browser out of the door
        "WEBUI_AUTH_SIGNOUT_REDIRECT_URL": LOGOUT_PATH,
        "DEFAULT_USER_ROLE": "user",
        "WEBUI_AUTH_TRUSTED_EMAIL_HEADER": EMAIL_HEADER,
        "WEBUI_AUTH_TRUSTED_NAME_HEADER": NAME_HEADER,
        "WEBUI_AUTH_TRUSTED_ROLE_HEADER": ROLE_HEADER,
        "ENABLE_OLLAMA_API": "False",
        "ENABLE_OPENAI_API": "True",
        "OPENAI_API_BASE_URLS": door.url,
        "OPENAI_API_KEYS": ui_key(s.api_key),
        "ENABLE_FORWARD_USER_INFO_HEADERS": "True",
        "FORWARD_USER_INFO_HEADER_JWT_SECRET": jwt_secret(s.api_key),
        "BYPASS_MODEL_ACCESS_CONTROL": "True",
        "DEFAULT_MODELS": default_model,
        "ENABLE_TITLE_GENERATION": "False",
        "ENABLE_FOLLOW_UP_GENERATION": "False",
        "ENABLE_TAGS_GENERATION": "False",
        "ENABLE_SEARCH_QUERY_GENERATION": "False",
        "ENABLE_RETRIEVAL_QUERY_GENERATION": "False",
        "ENABLE_AUTOCOMPLETE_GENERATION": "False",
        "OFFLINE_MODE": "True",
        "HF_HUB_OFFLINE": "1",
        "ENABLE_VERSION_UPDATE_CHECK": "False",
        "ANONYMIZED_TELEMETRY": "False",
        "SCARF_NO_ANALYTICS": "true",
        "DO_NOT_TRACK": "true",
    }
    if door.ca:  # the door's certificate, for its https (aiohttp reads SSL_CERT_FILE, requests its own variable)
        values |= {"SSL_CERT_FILE": CA_IN_CONTAINER, "REQUESTS_CA_BUNDLE": CA_IN_CONTAINER}
    lines = [f"{k}={shlex.quote(v)}" for k, v in values.items()]
    head = "# Managed by sparkfleet: Open WebUI's settings (0600; its secrets are here only)\n"
    return head + "\n".join(lines) + "\n"


def unit(ui: ChatUi, image_ref: str, door_ca: bool = False) -> str:
    """The chat UI's systemd unit: its container on the host's network for its own requests, listening on its unix
    socket only (the guard alone reaches it, so the forwarded headers there are the door's: trusted), its data on
    the host."""
    command = (f"set -a; . {ENV_IN_CONTAINER}; set +a; exec python3 -m uvicorn open_webui.main:app "
               f"--uds {SOCKET_IN_CONTAINER} --forwarded-allow-ips \"*\"")
    return render._templates.get_template("sparkfleet-chat-ui.service.j2").render(
        image=image_ref, container=paths.CHAT_UI_CONTAINER, data=paths.CHAT_UI_DATA, image_data=IMAGE_DATA,
        socket_dir=paths.CHAT_UI_SOCKET_DIR, socket_dir_in_container=SOCKET_DIR_IN_CONTAINER,
        env=paths.CHAT_UI_ENV, env_in_container=ENV_IN_CONTAINER, command=shlex.quote(command), q=shlex.quote,
        door_ca=f"{paths.CHAT_UI_DOOR_CA}:{CA_IN_CONTAINER}:ro" if door_ca else None)


def version_change_command(old_digest: str | None, new_digest: str) -> str | None:
    """The shell line run before the unit moves from one image to another: the UI stopped, its database kept as
    `webui.db.<old digest>`; where the new image's own copy exists (a rollback), that copy back in place. The
    newer version's database stays in its copy, so nothing is lost either way. None when nothing moves."""
    if old_digest is None or old_digest == new_digest:
        return None
    db, backups = f"{paths.CHAT_UI_DATA}/webui.db", paths.CHAT_UI_BACKUPS
    old, new = (f"{backups}/webui.db.{d.removeprefix('sha256:')[:16]}" for d in (old_digest, new_digest))
    # SQLite's online backup: what its write-ahead log holds is in the copy too (a plain cp of webui.db misses it)
    backup = "import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))"
    return (f"systemctl stop {paths.CHAT_UI_UNIT_NAME} && mkdir -p -m 0700 {backups} && "
            f"if [ -f {db} ]; then rm -f {old} && python3 -c {shlex.quote(backup)} {db} {old}; fi && "
            f"if [ -f {new} ]; then rm -f {db}-wal {db}-shm && cp -p {new} {db}; fi")


# --- what the stages ensure (roles/desired.py) ----------------------------------------------------------------

IMAGE_RECORD = f"{paths.CHAT_UI_DIR}/image.json"  # the digest the unit runs: what a version change moves from
START_WAIT_S = 300  # a first start on a small box: Open WebUI's imports and its database's migrations


def recorded_digest(record: str | None) -> str | None:
    """The image digest IMAGE_RECORD names (as read from the host: untrusted text), None without one."""
    try:
        found = json.loads(record) if record else {}
    except ValueError:
        return None
    digest = found.get("digest") if isinstance(found, dict) else None
    return digest if isinstance(digest, str) else None


def chat_ui_state(ui: ChatUi, door_plans: list[HostPlan], pin: ImagePin, default_model: str,
                  record: str | None) -> DesiredState:
    """What the chat UI stage ensures on its host: its root-only directory and data (kept across versions), its
    settings and secrets (0600), the door's certificate where it trusts one, its database kept before a version
    change (`record`: IMAGE_RECORD as read from the host), its socket's directory (the guard's HAProxy's group
    only), its unit running `pin`, and the digest recorded; a change of unit, settings, certificate or socket
    directory is a restart, after which it must answer on its socket."""
    door = door_endpoint(door_plans)
    ca = (File(paths.CHAT_UI_DOOR_CA, "The door's certificate, which the chat UI trusts", src=door.ca) if door.ca else
          Absent(paths.CHAT_UI_DOOR_CA, f"{paths.CHAT_UI_DOOR_CA} absent (the door's certificate: none needed)"))
    move = version_change_command(recorded_digest(record), pin.digest)
    changes = (paths.CHAT_UI_UNIT_PATH, paths.CHAT_UI_ENV, paths.CHAT_UI_DOOR_CA, paths.CHAT_UI_SOCKET_DIR)
    return desired(
        Directory(paths.CHAT_UI_DIR, "Chat UI directory (root-only)", mode="0700"),
        Directory(paths.CHAT_UI_DATA, "Chat UI data (chats and settings; kept across versions)", mode="0700"),
        secret(paths.CHAT_UI_ENV, "Chat UI settings and secrets (root-only)", env_file(ui, door, default_model)),
        ca,
        Command(f"Chat UI's database kept before its version changes ({paths.CHAT_UI_BACKUPS})", move)
        if move else None,
        # in the guard's chroot, where its HAProxy (group haproxy) connects; a directory made anew is mounted anew
        Directory(paths.CHAT_UI_SOCKET_DIR, "Chat UI's socket directory (root and the guard's HAProxy only)",
                  mode="0710", owner=("root", haproxy.USER)),
        File(paths.CHAT_UI_UNIT_PATH, "Chat UI unit", content=unit(ui, pin.ref, door_ca=bool(door.ca))),
        Unit(paths.CHAT_UI_UNIT_NAME, "Chat UI enabled and running", restart_on=changes,
             daemon_reload_on=(paths.CHAT_UI_UNIT_PATH,)),
        File(IMAGE_RECORD, "Chat UI's image recorded",
             content=json.dumps({"digest": pin.digest, "ref": pin.ref}) + "\n"),
        HttpWait(f"Chat UI answers on its socket {paths.CHAT_UI_SOCKET}", f"http://open-webui{HEALTH}",
                 START_WAIT_S, 5, f"the chat UI did not answer within {START_WAIT_S}s: journalctl -u "
                 f"{paths.CHAT_UI_UNIT_NAME}", when=(paths.CHAT_UI_UNIT_NAME, *changes),
                 unix_socket=paths.CHAT_UI_SOCKET))


def no_chat_ui_state() -> DesiredState:
    """A host outside the group chat_ui runs no chat UI: one it ran before is stopped and its unit and settings
    removed. Its data directory stays (people's chats: an office removes it by hand, or moves it)."""
    why = f"this host is not in the group {paths.CHAT_UI_GROUP}"
    return desired(UnitRemoved(paths.CHAT_UI_UNIT_NAME, paths.CHAT_UI_UNIT_PATH, why),
                   [Absent(path, f"{path} removed ({why})") for path in (paths.CHAT_UI_ENV, paths.CHAT_UI_DOOR_CA)])
