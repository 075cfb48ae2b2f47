"""The chat UI (roles/chat_ui.py): its plan refuses what cannot work, its files hold their secrets only where they
must, and the real HAProxy, on the generated configs, lets a person in by their own key only, counts and limits
Open WebUI's requests as the person its signed token names, and refuses a forged, expired or unsigned one."""

from __future__ import annotations

import shlex
import socket
import socketserver
import sqlite3
import threading
import subprocess
import time
from pathlib import Path

import base64
import contextlib
import hashlib
import hmac
import json

import pytest
import requests

from sparkfleet.contract import paths
from sparkfleet.contract.settings import SettingsError
from sparkfleet.release.image import ImagePin
from sparkfleet.roles import chat_ui, guard, haproxy
from sparkfleet.roles.front_door import plan as fd_plan

from tests.tiers import needs
from .helpers import KEY, ROOT, Recorder, Server, door_files, guard_files, make_model, wait_for
from .test_front_door import NAME, plans

ALICE, BOB = "alice-key-0123456789abcdef", "bob-key-0123456789abcdef"


def ui_plans(**over):
    users = {"alice": {"key": ALICE, "requests_per_minute": 2}, "bob": BOB}
    return plans(**{"spark-a": {"front_door_users": users, **over}, "spark-b": {"front_door_users": users, **over}})


# --- the plan: refused before any host is touched -------------------------------------------------------------

def test_one_spark_runs_it_and_its_door_port_and_host_port_are_checked():
    ps = ui_plans()
    ui = chat_ui.chat_ui_plan(["spark-b"], ps)
    assert (ui.host, ui.address, ui.target) == ("spark-b", "10.0.0.2", "10.0.0.2:8095")
    assert chat_ui.chat_ui_plan([], ps) is None
    with pytest.raises(SettingsError, match="one host runs the chat UI"):
        chat_ui.chat_ui_plan(["spark-a", "spark-b"], ps)
    with pytest.raises(SettingsError, match="`chat_ui_host_port` = 8000 collides with api_port"):
        chat_ui.chat_ui_plan(["spark-b"], ui_plans(chat_ui_host_port=8000))
    with pytest.raises(SettingsError, match="`chat_ui_port` = 8080 is `front_door_port` too"):
        fd_plan.front_door_plan("spark-a", ui_plans(chat_ui_port=8080), ui=ui)


@pytest.mark.parametrize("setting, value", [
    ("chat_ui_image", "ghcr.io/open-webui/open-webui:v1; rm -rf /"),
    ("chat_ui_image", "--privileged"),
    ("chat_ui_image", "x\nExecStartPre=/bin/sh"),
    ("chat_ui_port", 0), ("chat_ui_port", 70000), ("chat_ui_port", "3000; x"),
    ("chat_ui_host_port", -1), ("chat_ui_host_port", "8095 -p 1"), ("chat_ui_host_port", 80.5),
])
def test_hostile_chat_ui_settings_are_refused_naming_the_setting(setting, value):
    with pytest.raises(SettingsError, match=setting):
        plans(**{"spark-a": {setting: value}})


def test_open_webui_listens_on_a_socket_only_the_guard_reaches_never_on_a_port():
    """Open WebUI shares its host's network with the engines: on a port of loopback, any local process (an engine
    running a hub's code) could send it a door's identity headers. It binds a unix socket instead, in a directory of
    the guard's chroot (root and HAProxy's group only, 0710) that only its own container mounts; the guard's server
    line names that socket as its chrooted HAProxy sees it, and the stage's wait asks there too."""
    ps = ui_plans()
    ui = chat_ui.chat_ui_plan(["spark-b"], ps)
    unit = chat_ui.unit(ui, "r/x:1")
    [command] = [shlex.split(line)[-1] for line in unit.splitlines() if "open_webui.main:app" in line]
    uvicorn = shlex.split(command.partition("exec ")[2])
    assert uvicorn[uvicorn.index("--uds") + 1] == chat_ui.SOCKET_IN_CONTAINER
    assert "--host" not in uvicorn and "--port" not in uvicorn and "--fd" not in uvicorn
    # a unix socket's peer has no address: uvicorn trusts the forwarded headers there only with "*" (the guard is
    # all that connects, and the door their only author)
    assert uvicorn[uvicorn.index("--forwarded-allow-ips") + 1] == "*"
    assert chat_ui.SOCKET_IN_CONTAINER == f"{chat_ui.SOCKET_DIR_IN_CONTAINER}/{Path(paths.CHAT_UI_SOCKET).name}"
    assert f"--volume {paths.CHAT_UI_SOCKET_DIR}:{chat_ui.SOCKET_DIR_IN_CONTAINER} " in unit
    assert paths.CHAT_UI_SOCKET_DIR.startswith(f"{paths.HAPROXY_CHROOT}/")
    config = guard.guard_plan(ps["spark-b"], runs_chat_ui=True).config()
    servers = [line.split() for line in config.splitlines() if line.split()[:2] == ["server", "ui"]]
    assert servers == [["server", "ui", f"unix@{paths.CHAT_UI_SOCKET.removeprefix(paths.HAPROXY_CHROOT)}"]]
    old_port = str(paths.engine_port(8095))  # where it listened on loopback before
    assert old_port not in unit and old_port not in config
    state = chat_ui.chat_ui_state(ui, [ps["spark-a"]], ImagePin("r/x:1", "sha256:" + "1" * 64, "given"), NAME, None)
    directory = state.directories[paths.CHAT_UI_SOCKET_DIR]
    assert (directory.mode, directory.owner) == ("0710", ("root", haproxy.USER))
    assert paths.CHAT_UI_SOCKET_DIR in state.units[paths.CHAT_UI_UNIT_NAME].restart_on  # remade: mounted anew
    [wait] = state.waits.values()
    assert wait.unix_socket == paths.CHAT_UI_SOCKET and old_port not in wait.url


def test_two_users_one_account_apart_only_by_case_are_refused():
    users = {"alice": ALICE, "Alice": BOB}
    with pytest.raises(SettingsError, match="differ only in case"):
        chat_ui.chat_ui_plan(["spark-a"], plans(**{"spark-a": {"front_door_users": users}}))


def test_secrets_are_only_in_the_0600_files_never_in_a_config_or_unit():
    ps = ui_plans()
    ui = chat_ui.chat_ui_plan(["spark-b"], ps)
    door = fd_plan.front_door_plan("spark-a", ps, ui=ui)
    secrets = {chat_ui.ui_key(KEY), chat_ui.jwt_secret(KEY), chat_ui.derived(KEY, "session"), KEY, ALICE, BOB}
    public = [door.config(), door.unit(), chat_ui.unit(ui, "r/x@sha256:" + "a" * 64),
              guard.guard_plan(ps["spark-b"], runs_chat_ui=True).config()]
    assert not [s for s in secrets for text in public if s in text]
    env = chat_ui.env_file(ui, chat_ui.door_endpoint([ps["spark-a"]]), NAME)
    assert chat_ui.jwt_secret(KEY) in env and chat_ui.ui_key(KEY) in env and KEY not in env.split("\n")
    assert chat_ui.jwt_secret(KEY) in door.secrets_config()
    assert f"{chat_ui.ui_key(KEY)} {chat_ui.UI_USER}\n" in door.users_map()
    # a new api_key renews every derived secret
    assert chat_ui.ui_key("another-key") != chat_ui.ui_key(KEY)


def test_over_https_open_webui_trusts_the_doors_certificate_from_a_file_it_mounts(tmp_path):
    cert = tmp_path / "door.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    (tmp_path / "door.key").write_text("key")
    tls = {"front_door_tls_cert": str(cert), "front_door_tls_key": str(tmp_path / "door.key"),
           "controller_front_door_ca": str(cert)}
    ps = ui_plans(**tls)
    ui = chat_ui.chat_ui_plan(["spark-b"], ps)
    door = chat_ui.door_endpoint([ps["spark-a"]])
    assert door == chat_ui.DoorEndpoint("https://10.0.0.1:8080/v1", str(cert))
    env = chat_ui.env_file(ui, door, NAME)
    assert f"SSL_CERT_FILE={chat_ui.CA_IN_CONTAINER}" in env and f"REQUESTS_CA_BUNDLE={chat_ui.CA_IN_CONTAINER}" in env
    assert f"--volume {paths.CHAT_UI_DOOR_CA}:{chat_ui.CA_IN_CONTAINER}:ro" in chat_ui.unit(ui, "r/x:1", door_ca=True)
    plain = chat_ui.door_endpoint([ui_plans()["spark-a"]])
    assert plain == chat_ui.DoorEndpoint("http://10.0.0.1:8080/v1")
    assert "SSL_CERT_FILE" not in chat_ui.env_file(ui, plain, NAME)
    assert paths.CHAT_UI_DOOR_CA not in chat_ui.unit(ui, "r/x:1")


def test_without_a_chat_ui_the_door_and_its_unit_are_as_before():
    door = fd_plan.front_door_plan("spark-a", ui_plans())
    assert "chat_ui" not in door.config() and "secrets.cfg" not in door.unit()
    assert chat_ui.UI_USER not in door.users_map() and door.secrets_config() is None
    assert "chat_ui" not in guard.guard_plan(ui_plans()["spark-a"]).config()


def test_a_version_change_keeps_the_database_and_a_rollback_puts_its_copy_back():
    old, new = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    assert chat_ui.version_change_command(None, new) is None
    assert chat_ui.version_change_command(new, new) is None
    line = chat_ui.version_change_command(old, new)
    assert line.index("systemctl stop") < line.index("backup") < line.index(f"webui.db.{'2' * 16}")


def _chats(db: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(db)) as c:
        return [row[0] for row in c.execute("SELECT text FROM chat ORDER BY rowid")]


def test_the_version_change_keeps_what_sqlites_log_holds_and_a_rollback_puts_that_copy_back(tmp_path):
    """The line itself, in sh, on a data directory moved under tmp_path (systemctl stubbed), with Open WebUI's
    SQLite in write-ahead-log mode and its last chat still in the log only (its connection open, as a stopped
    container's may leave it): the copy holds it."""
    one, two = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    data, backups = tmp_path / "data", tmp_path / "backups"
    data.mkdir()
    db = data / "webui.db"
    writer = sqlite3.connect(db)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("CREATE TABLE chat (text)")
    writer.execute("INSERT INTO chat VALUES ('bob: on version 1')")
    writer.commit()
    assert (data / "webui.db-wal").stat().st_size > 0  # the chat is in the log, not yet in webui.db

    def run(line: str) -> None:
        line = line.replace(paths.CHAT_UI_DATA, str(data)).replace(paths.CHAT_UI_BACKUPS, str(backups))
        subprocess.run(["sh", "-c", line.replace("systemctl stop", "true")], check=True)

    run(chat_ui.version_change_command(one, two))  # the upgrade
    writer.close()
    assert _chats(backups / f"webui.db.{'1' * 16}") == ["bob: on version 1"]
    with contextlib.closing(sqlite3.connect(db)) as c:  # the newer version's own chat (it is stopped after)
        c.execute("INSERT INTO chat VALUES ('bob: on version 2')")
        c.commit()
    run(chat_ui.version_change_command(two, one))  # the rollback
    assert _chats(db) == ["bob: on version 1"]
    assert _chats(backups / f"webui.db.{'2' * 16}") == ["bob: on version 1", "bob: on version 2"]  # kept


# --- the real HAProxy --------------------------------------------------------------------------------------------

def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(configs: list[Path]) -> subprocess.Popen:
    args = [a for c in configs for a in ("-f", str(c))]
    check = subprocess.run(["haproxy", "-c", *args], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    return subprocess.Popen(["haproxy", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _runnable(config: str, moved: dict[str, str]) -> str:
    for old, new in moved.items():
        config = config.replace(old, new)
    return "\n".join(line for line in config.splitlines()
                     if line.split()[:1] not in (["user"], ["group"], ["chroot"])) + "\n"


@pytest.fixture(scope="module")
@needs("haproxy")
def door(tmp_path_factory):
    """A door with a chat UI in front of a loopback stand-in engine; its chat UI server is a recorder."""
    tmp = tmp_path_factory.mktemp("chat-ui")
    engine = Server(make_model(tmp / "model"), "--served-model-name", NAME, "--api-key", KEY,
                    SIM_TOKENS_PER_S="200", SIM_FIRST_TOKEN_DELAY_MS="5")
    ui_server = Recorder({})
    api, page = _port(), _port()
    ps = ui_plans(lan_address="127.0.0.1", front_door_port=api, chat_ui_port=page)
    ui = chat_ui.chat_ui_plan(["spark-b"], ps)
    ui = chat_ui.ChatUi(ui.host, "127.0.0.1", ui.settings.model_copy(update={"chat_ui_host_port": ui_server.port}))
    planned = fd_plan.front_door_plan("spark-a", ps, ui=ui)
    planned = fd_plan.FrontDoor(planned.host, planned.settings, (fd_plan.Backend("spark-a", "127.0.0.1", engine.port),),
                                planned.api_key, chat_ui=ui)
    door_files(planned, tmp)
    (tmp / Path(paths.FRONT_DOOR_CHAT_UI_USERS).name).write_text(planned.chat_ui_users_map())
    (tmp / Path(paths.FRONT_DOOR_LOGIN_PAGE).name).write_text((ROOT / "files" / "chat-ui-login.html").read_text())
    (tmp / "secrets.cfg").write_text(planned.secrets_config())
    moved = {paths.FRONT_DOOR_DIR: str(tmp), paths.FRONT_DOOR_SOCKET: str(tmp / "admin.sock"),
             paths.FRONT_DOOR_STATE_FILE: str(tmp / "state"), f"bind :{api}": f"bind 127.0.0.1:{api}",
             f"bind :{page}": f"bind 127.0.0.1:{page}", paths.FRONT_DOOR_USAGE_SNAPSHOT: str(tmp / "usage.snapshot")}
    (tmp / "haproxy.cfg").write_text(_runnable(planned.config(), moved))
    proc = _start([tmp / "secrets.cfg", tmp / "haproxy.cfg"])
    try:
        wait_for(lambda: requests.get(f"http://127.0.0.1:{api}/health", timeout=1).status_code == 200)
        yield {"api": f"http://127.0.0.1:{api}", "page": f"http://127.0.0.1:{page}", "ui": ui_server}
    finally:
        proc.terminate()
        proc.wait()
        engine.stop()
        ui_server.close()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def mint(payload: dict, secret: str | None, alg: str = "HS256") -> str:
    """A JWT as Open WebUI mints its forwarded one (PyJWT, HS256); alg "none": unsigned."""
    head = _b64(json.dumps({"alg": alg, "typ": "JWT"}).encode()) + "." + _b64(json.dumps(payload).encode())
    sig = hmac.new(secret.encode(), head.encode(), hashlib.sha256).digest() if secret else b""
    return head + "." + _b64(sig)


def token(email: str, secret: str = "", expires_in: int = 300) -> str:
    now = int(time.time())
    return mint({"sub": "1", "email": email, "name": email, "role": "user", "iss": "open-webui", "iat": now,
                 "exp": now + expires_in}, secret or chat_ui.jwt_secret(KEY))


def ask(door, jwt_value: str | None, path="/v1/chat/completions", key: str | None = None) -> requests.Response:
    headers = {"Authorization": f"Bearer {key or chat_ui.ui_key(KEY)}"}
    if jwt_value is not None:
        headers[chat_ui.JWT_HEADER] = jwt_value
    if path == "/v1/models":
        return requests.get(door["api"] + path, headers=headers, timeout=30)
    return requests.post(door["api"] + path, headers=headers, timeout=30,
                         json={"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})


def test_the_ui_asks_as_the_person_its_token_names_and_their_limit_holds(door):
    assert ask(door, token("bob@sparkfleet.invalid")).status_code == 200
    answers = [ask(door, token("alice@sparkfleet.invalid")).status_code for _ in range(4)]
    assert answers[:2] == [200, 200] and 429 in answers[2:], answers  # alice: 2 a minute
    assert ask(door, token("bob@sparkfleet.invalid")).status_code == 200  # bob keeps chatting


@pytest.mark.parametrize("why, value", [
    ("no token", None),
    ("signed with another secret", token("bob@sparkfleet.invalid", secret="x" * 43)),
    ("expired", token("bob@sparkfleet.invalid", expires_in=-5)),
    ("a name that is no user (removed)", token("mallory@sparkfleet.invalid")),
    ("unsigned (alg none)", mint({"email": "bob@sparkfleet.invalid", "exp": int(time.time()) + 300}, None, "none")),
    ("garbage", "not.a.token"),
])
def test_the_ui_key_without_a_valid_token_reaches_no_model(door, why, value):
    assert ask(door, value).status_code == 401, why


def test_the_ui_key_lists_the_models_and_a_users_key_cannot_borrow_a_token(door):
    assert ask(door, None, "/v1/models").status_code == 200
    # bob's own key with a token naming alice: bob's request (counted as bob), never alice's
    assert ask(door, token("alice@sparkfleet.invalid"), key=BOB).status_code == 200


def test_a_browser_signs_in_with_its_key_and_reaches_the_ui_as_itself(door):
    page, ui = door["page"], door["ui"]
    first = requests.get(page + "/", headers={"Accept": "text/html"}, allow_redirects=False, timeout=5)
    assert first.status_code == 303 and first.headers["Location"] == chat_ui.LOGIN_PATH
    assert requests.get(page + "/api/config", timeout=5).status_code == 401
    assert "Your key" in requests.get(page + chat_ui.LOGIN_PATH, timeout=5).text
    wrong = requests.post(page + chat_ui.LOGIN_PATH, data={"key": "wrong-key-0123456789"}, allow_redirects=False,
                          timeout=5)
    assert wrong.status_code == 401 and "Set-Cookie" not in wrong.headers
    ui_key = requests.post(page + chat_ui.LOGIN_PATH, data={"key": chat_ui.ui_key(KEY)}, allow_redirects=False,
                           timeout=5)
    assert ui_key.status_code == 401  # the UI's own key is nobody's login
    signed = requests.post(page + chat_ui.LOGIN_PATH, data={"key": ALICE}, allow_redirects=False, timeout=5)
    assert signed.status_code == 303 and signed.headers["Location"] == "/"
    cookie = signed.headers["Set-Cookie"]
    assert cookie.startswith(f"{chat_ui.COOKIE}={ALICE};") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    ui.seen.clear()
    forged = {chat_ui.EMAIL_HEADER: "bob@sparkfleet.invalid", chat_ui.NAME_HEADER: "bob",
              chat_ui.ROLE_HEADER: "admin", chat_ui.DOOR_HEADER: "Bearer guess",
              "Cookie": f"token=owui-session; {chat_ui.COOKIE}={ALICE}; theme=dark"}
    assert requests.get(page + "/api/chats", headers=forged, timeout=5).status_code == 200
    seen = {k.lower(): v for k, v in ui.seen[-1][2].items()}
    assert seen[chat_ui.EMAIL_HEADER.lower()] == "alice@sparkfleet.invalid"
    assert (seen[chat_ui.NAME_HEADER.lower()], seen[chat_ui.ROLE_HEADER.lower()]) == ("alice", "user")
    assert seen[chat_ui.DOOR_HEADER.lower()] == f"Bearer {KEY}"  # the door's, not the client's
    assert ALICE not in seen["cookie"] and "token=owui-session" in seen["cookie"] and "theme=dark" in seen["cookie"]


def test_a_key_that_is_no_longer_a_user_opens_nothing(door):
    gone = {"Cookie": f"{chat_ui.COOKIE}=mallory-key-0123456789abc", "Accept": "text/html"}
    answer = requests.get(door["page"] + "/", headers=gone, allow_redirects=False, timeout=5)
    assert answer.status_code == 303 and answer.headers["Location"] == chat_ui.LOGIN_PATH


class _UnixHttp(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@contextlib.contextmanager
def _on_socket(recorder: Recorder, path: Path):
    """`recorder`'s handler (the same `seen`) also answering on a unix socket at `path`, as Open WebUI does."""
    server = _UnixHttp(str(path), recorder.server.RequestHandlerClass)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@needs("haproxy")
def test_the_guard_lets_only_a_door_reach_the_ui(tmp_path):
    """The guard's own config (its chroot taken away: the socket moved under tmp_path, where the chroot would find
    it), the UI a recorder on a unix socket: only the engines' key in the door's header gets a request through."""
    ui_server = Recorder({})
    port = _port()
    plan = ui_plans(chat_ui_host_port=port, api_host="127.0.0.1")["spark-b"]
    g = guard.guard_plan(plan, runs_chat_ui=True)
    guard_files(g, tmp_path)
    in_chroot = paths.CHAT_UI_SOCKET.removeprefix(paths.HAPROXY_CHROOT)
    moved = {paths.GUARD_DIR: str(tmp_path), paths.GUARD_STATS_SOCKET: str(tmp_path / "stats.sock"),
             f"unix@{in_chroot}": f"unix@{tmp_path / 'ui.sock'}"}
    config = _runnable(g.config(), moved)
    assert f"unix@{tmp_path / 'ui.sock'}" in config
    config = "\n".join(line for line in config.splitlines() if line.strip() != "bind 127.0.0.1:8000")
    (tmp_path / "guard.cfg").write_text(config + "\n")
    proc = _start([tmp_path / "guard.cfg"])
    try:
        with _on_socket(ui_server, tmp_path / "ui.sock"):
            url = f"http://127.0.0.1:{port}/api/chats"
            wait_for(lambda: requests.get(url, timeout=1).status_code == 401)
            impersonating = {chat_ui.EMAIL_HEADER: "alice@sparkfleet.invalid", chat_ui.DOOR_HEADER: "Bearer guess"}
            assert requests.get(url, headers=impersonating, timeout=5).status_code == 401
            assert not ui_server.seen
            assert requests.get(url, headers={chat_ui.DOOR_HEADER: f"Bearer {KEY}"}, timeout=5).status_code == 200
            assert chat_ui.DOOR_HEADER.lower() not in {k.lower() for k in ui_server.seen[-1][2]}
    finally:
        proc.terminate()
        proc.wait()
        ui_server.close()
