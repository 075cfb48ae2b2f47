"""The chat UI on the host of the group `chat_ui`: Open WebUI running, on loopback only, its settings and data
root-only, the doors' way in (its guard) listening; every front door offers its sign-in page."""

from __future__ import annotations

import pytest

from sparkfleet.contract import paths
from sparkfleet.roles import chat_ui as rules

from .conftest import chat_ui_of


@pytest.fixture
def ui(request):
    """The inventory's chat UI (its host alone is given: a fleet without one deselects these checks)."""
    return chat_ui_of(request.config)


def test_open_webui_runs_enabled_and_answers_on_loopback_only(chat_ui_host, ui):
    service = chat_ui_host.host.service(paths.CHAT_UI_UNIT_NAME)
    assert service.is_running and service.is_enabled
    assert chat_ui_host.host.socket(f"tcp://127.0.0.1:{ui.local_port}").is_listening
    assert not chat_ui_host.host.socket(f"tcp://0.0.0.0:{ui.local_port}").is_listening
    assert chat_ui_host.host.run(f"curl -fs --max-time 10 http://127.0.0.1:{ui.local_port}{rules.HEALTH}").rc == 0
    assert chat_ui_host.host.socket(f"tcp://{ui.settings.api_host}:{ui.settings.chat_ui_host_port}").is_listening


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
