"""The chat UI on the host of the group `chat_ui`: Open WebUI running, listening on no port but its unix socket in
the guard's chroot (which only root and the guard's HAProxy reach), its settings and data root-only, the doors' way
in (its guard) listening; every front door offers its sign-in page."""

from __future__ import annotations

import shlex

import pytest

from sparkfleet.contract import paths
from sparkfleet.roles import chat_ui as rules

from .conftest import chat_ui_of

# an unprivileged local process (an engine's hub code, any user's): Debian's nobody, no supplementary group
NOBODY = "setpriv --reuid=nobody --regid=nogroup --clear-groups --"


@pytest.fixture
def ui(request):
    """The inventory's chat UI (its host alone is given: a fleet without one deselects these checks)."""
    return chat_ui_of(request.config)


def _ask_socket(host, prefix: str = "") -> int:
    """curl's exit status asking Open WebUI's /health on its socket (0: it answered 2xx)."""
    curl = shlex.join(["curl", "-fs", "--max-time", "10", "--unix-socket", paths.CHAT_UI_SOCKET,
                       f"http://open-webui{rules.HEALTH}"])
    return host.run(f"{prefix} {curl}".strip()).rc


def test_open_webui_runs_enabled_and_answers_on_its_socket_only(chat_ui_host, ui):
    service = chat_ui_host.host.service(paths.CHAT_UI_UNIT_NAME)
    assert service.is_running and service.is_enabled
    assert _ask_socket(chat_ui_host.host) == 0
    assert chat_ui_host.host.socket(f"tcp://{ui.settings.api_host}:{ui.settings.chat_ui_host_port}").is_listening


def test_nothing_listens_where_open_webui_listened_on_tcp(chat_ui_host, ui):
    """Before, Open WebUI listened on 127.0.0.1 of its host, which shares its network with the engines: any local
    process could send it a forged identity header. No TCP listener of any address on that port now."""
    old = paths.engine_port(ui.settings.chat_ui_host_port)
    listening = chat_ui_host.host.run("ss -Hltn")
    assert listening.rc == 0
    ports = {line.split()[3].rpartition(":")[2] for line in listening.stdout.splitlines() if line.strip()}
    assert ports and str(old) not in ports, listening.stdout


def test_its_socket_is_out_of_reach_of_an_unprivileged_local_process(chat_ui_host, ui):
    """The socket's directory is root's and the guard HAProxy's group's, 0710: nobody else traverses it, so a local
    process that is neither root nor HAProxy cannot connect, while root can (the same ask, the user changed)."""
    directory = chat_ui_host.host.file(paths.CHAT_UI_SOCKET_DIR)
    assert directory.is_directory
    assert (directory.user, directory.group, directory.mode) == ("root", "haproxy", 0o710)
    assert chat_ui_host.host.run(f"{NOBODY} test -x {paths.CHAT_UI_SOCKET_DIR}").rc != 0
    assert _ask_socket(chat_ui_host.host, NOBODY) != 0
    assert _ask_socket(chat_ui_host.host) == 0


def test_no_other_container_mounts_the_socket(chat_ui_host, ui):
    """An engine runs as root in its container: what it could reach is what is mounted there, never the socket."""
    listed = chat_ui_host.host.run("docker ps -q")
    assert listed.rc == 0
    ids = listed.stdout.split()
    assert ids  # the chat UI's container at least
    mounts = chat_ui_host.host.run("docker inspect -f '{{.Name}} {{range .Mounts}}{{.Source}} {{end}}' "
                                   + " ".join(ids))
    assert mounts.rc == 0
    holders = {line.split()[0].lstrip("/") for line in mounts.stdout.splitlines()
               if any(src.startswith(paths.HAPROXY_CHROOT) for src in line.split()[1:])}
    assert holders == {paths.CHAT_UI_CONTAINER}, mounts.stdout


def test_its_settings_and_data_are_root_only(chat_ui_host, ui):
    env, data = chat_ui_host.host.file(paths.CHAT_UI_ENV), chat_ui_host.host.file(paths.CHAT_UI_DATA)
    assert (env.user, env.mode) == ("root", 0o600)
    assert data.is_directory and data.mode == 0o700
    assert chat_ui_host.host.file(f"{paths.CHAT_UI_DATA}/webui.db").exists  # its chats and accounts, on the host


def test_no_secret_in_its_container_metadata(chat_ui_host, ui):
    shown = chat_ui_host.host.run(f"docker inspect {paths.CHAT_UI_CONTAINER}")
    assert shown.rc == 0
    for secret in (rules.ui_key(ui.settings.api_key), rules.jwt_secret(ui.settings.api_key), ui.settings.api_key):
        assert secret not in shown.stdout
