"""Colleagues chat in a browser (issue 39), on the simulated fleet: the genuine Open WebUI release (built from its
PyPI wheel into the sim's registry: `python -m sim chat-ui`) on spark-1, behind door-1's port 3000, driven by
Debian's headless Chromium through Selenium. Its users are an office's: a 0600 secrets file that `sparkfleet users`
edits. The module leaves the fleet as inventory/sim_front_door.py has it (no chat UI running; its data kept).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests

from sparkfleet.contract import paths
from sparkfleet.contract.private_files import write_private
from sparkfleet.roles import chat_ui
from sparkfleet.fleet.users import read_secrets, write_secrets
from tests.cross_site import ATTACKER_FORM, another_site
from tests.waiting import wait_until

from .conftest import ROOT, container, converge, ssh, sparkfleet

pytestmark = [pytest.mark.e2e, pytest.mark.chromium]

UI_HOST, DOOR = "spark-1", "door-1"
BACKUP_HOST, NEW_UI_HOST = "spark-3", "spark-2"  # the group backup's host; where the chat UI moves when spark-1 dies
IMAGE = "sparkfleet-registry:5000/open-webui/open-webui:v0.12.4"  # `python -m sim chat-ui` pushes it
NEXT = f"{IMAGE}-next"  # the same release under another tag and image id: a version change (sim/fleet/images.py)
CONFIG = Path.home() / ".config" / "sparkfleet"  # where the sim keeps its fleets' CA and backup password
SIGN_IN_S = 90  # a first page load: Open WebUI's frontend bundle and its first account, on a shared 2-core box


def write_inventory(directory, secrets, image: str = IMAGE, name: str = "chat_office.py", ui_host: str = UI_HOST,
                    lost: tuple[str, ...] = ()) -> str:
    """inventory/sim_front_door.py (the session's fleet: one door) with the chat UI on `ui_host` (spark-1), its
    backups on spark-3 (the group backup) and its users read from `secrets`, as `sparkfleet init` writes an office's
    (inventory/sim_chat_ui.py is the demo's: two doors); the Sparks of `lost` left out (a Spark that died)."""
    path = directory / name
    path.write_text(
        "import runpy\nfrom sparkfleet.fleet.users import read_secrets\n"
        f"SPARKFLEET_SECRETS = {str(secrets)!r}\n"
        f"_one = runpy.run_path({str(ROOT / 'inventory/sim_front_door.py')!r})\n"
        "_ui = {'front_door_users': read_secrets(SPARKFLEET_SECRETS)['users'],\n"
        f"       'chat_ui_image': {image!r}}}\n"
        f"sparks = [(n, {{**d, **_ui}}) for n, d in _one['sparks'] if n not in {lost!r}]\n"
        "front_door = [(n, {**d, **_ui}) for n, d in _one['front_door']]\n"
        f"monitoring = _one['monitoring']\nchat_ui = [{ui_host!r}]\nbackup = [{BACKUP_HOST!r}]\n")
    return str(path)


def door_address() -> str:
    """door-1's address on the sim's network, which this machine reaches over the Docker bridge."""
    out = subprocess.run(["docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
                          container(DOOR)], capture_output=True, text=True, check=True).stdout.split()
    return out[0]


@pytest.fixture(scope="module")
def office(sim_fleet, first_converge, tmp_path_factory):
    """The fleet converged with the chat UI; (state, inventory, secrets file, the sign-in URL)."""
    from sim import fleet

    fleet.chat_ui_image()  # built (minutes, the first time) and pushed; a later call finds both done
    tmp = tmp_path_factory.mktemp("chat_ui")
    secrets = tmp / "keys" / "office.json"
    secrets.parent.mkdir(mode=0o700)
    write_secrets(secrets, {"api_key": "sim-key", "users": {}})
    inventory = write_inventory(tmp, secrets)
    for name in ("alice", "bob"):
        assert sparkfleet("users", "add", inventory, name).returncode == 0
    assert sparkfleet("users", "limit", inventory, "alice", "--requests-per-minute", "3").returncode == 0
    done = converge(inventory=inventory)
    assert done.returncode == 0, done.output[-4000:]
    url = f"http://{door_address()}:{3000}"
    wait_until(lambda: requests.get(f"{url}{chat_ui.LOGIN_PATH}", timeout=5).status_code == 200, 60,
               "door-1 serves the sign-in page", ignore=(requests.RequestException,))
    yield fleet.load_state(), inventory, secrets, url
    try:  # the next module's fixtures converge what they need themselves: a failure here is reported, not raised
        back = converge(inventory=str(ROOT / "inventory/sim_front_door.py"))
        if back.returncode:
            print(f"chat UI's teardown: the converge without it failed:\n{back.output[-3000:]}")
    except AssertionError as exc:
        print(f"chat UI's teardown: {exc}"[:3000])


def key_of(secrets, name: str) -> str:
    value = read_secrets(secrets)["users"][name]
    return value if isinstance(value, str) else value["key"]


class Browser:
    """Debian's Chromium, headless, driven by Selenium: one person's browser."""

    def __init__(self, url: str):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--window-size=1400,900"):
            options.add_argument(flag)
        self.url = url
        self.driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)

    def sign_in(self, key: str) -> bool:
        """The door's page, the key typed and sent; True once Open WebUI's chat box is there, False when the page
        stays (the door refused the key)."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions
        from selenium.webdriver.support.wait import WebDriverWait

        self.driver.get(self.url + "/")
        assert self.driver.current_url.endswith(chat_ui.LOGIN_PATH), self.driver.current_url
        field = self.driver.find_element(By.ID, "key")
        field.send_keys(key)
        self.driver.find_element(By.ID, "sign-in").click()
        deadline = time.monotonic() + SIGN_IN_S
        # the form's page is left either way (the door answers the POST with a redirect to the UI, or with its sign-in
        # page again): judged on the next page, not on the form still showing before the browser has moved on
        WebDriverWait(self.driver, SIGN_IN_S).until(expected_conditions.staleness_of(field))
        while time.monotonic() < deadline:
            if self.driver.current_url.endswith(chat_ui.LOGIN_PATH) and self.driver.find_elements(By.ID, "key"):
                return False
            if self.driver.find_elements(By.ID, "chat-input"):
                return True
            time.sleep(0.5)
        raise AssertionError(f"neither the chat nor the sign-in page after {SIGN_IN_S}s: {self.driver.current_url}")

    def models(self) -> str:
        return self.driver.page_source

    def ask(self, text: str, timeout: float = 60) -> str:
        """A message typed and sent; the answer's text once it stops growing (streamed)."""
        from selenium.common.exceptions import StaleElementReferenceException
        from selenium.webdriver.common.by import By
        from selenium.webdriver.common.keys import Keys

        before = len(self.driver.find_elements(By.CSS_SELECTOR, ".chat-assistant"))
        box = self.driver.find_element(By.ID, "chat-input")
        box.send_keys(text)
        box.send_keys(Keys.ENTER)
        deadline, last, steady = time.monotonic() + timeout, None, 0
        while time.monotonic() < deadline:
            try:  # the page re-renders the answer while it streams: an element read may be gone a moment later
                answers = self.driver.find_elements(By.CSS_SELECTOR, ".chat-assistant")
                now = answers[-1].text if len(answers) > before else None
            except StaleElementReferenceException:
                now = None
            steady = steady + 1 if now and now == last else 0
            if steady >= 4:
                return now
            last = now
            time.sleep(0.5)
        raise AssertionError(f"no settled answer to {text!r} within {timeout}s (last: {last!r})")

    def new_chat(self) -> None:
        self.driver.get(self.url + "/")

    def close(self) -> None:
        self.driver.quit()


def usage(inventory: str) -> dict[str, int]:
    proc = sparkfleet("usage", inventory, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {name: row["requests"] for name, row in json.loads(proc.stdout)["users"].items()}


def test_alice_chats_in_a_browser_as_herself_counted_and_limited_while_bob_keeps_chatting(office, tmp_path):
    state, inventory, secrets, url = office
    before = usage(inventory)
    alice, bob = Browser(url), Browser(url)
    try:
        assert alice.sign_in(key_of(secrets, "alice"))
        assert "Qwen3.5-35B-A3B" in alice.models()  # the fleet's model in the picker, by its served name
        answer = alice.ask("Say hello to the office")
        assert answer and "error" not in answer.lower() and "too many" not in answer, answer
        # docs/chat-ui.png is this picture (SPARKFLEET_DOCS_SHOTS=1 writes it there)
        shot = ROOT / "docs" / "chat-ui.png" if os.environ.get("SPARKFLEET_DOCS_SHOTS") else tmp_path / "chat.png"
        assert alice.driver.save_screenshot(str(shot))
        wait_until(lambda: usage(inventory).get("alice", 0) > before.get("alice", 0), 30,
                   "alice's request in `sparkfleet usage`", explain=lambda: repr(usage(inventory)))
        # 3 a minute: past them, the door's message in her chat; bob is not held back by it
        refused = [alice.ask(f"question {n}") for n in range(3)]
        assert any("too many requests a minute" in a for a in refused), refused
        assert bob.sign_in(key_of(secrets, "bob"))
        answer = bob.ask("And hello from bob")
        assert answer and "too many" not in answer and "error" not in answer.lower(), answer
    finally:
        alice.close()
        bob.close()


def bobs_chats(url: str, key: str) -> list[str]:
    """Bob's chats' messages, through the door with his key (the door's cookie) and Open WebUI's own session."""
    with requests.Session() as s:
        s.cookies.set(chat_ui.COOKIE, key)
        token = s.post(f"{url}/api/v1/auths/signin", json={"email": "", "password": ""}, timeout=30).json()["token"]
        headers = {"Authorization": f"Bearer {token}"}
        listed = s.get(f"{url}/api/v1/chats/", headers=headers, timeout=30).json()
        return [json.dumps(s.get(f"{url}/api/v1/chats/{c['id']}", headers=headers, timeout=30).json())
                for c in listed]


def bob_says(url: str, secrets, what: str) -> str:
    """bob, in his browser, starts a chat with a message of its own; the message."""
    marker = f"{what} {uuid.uuid4().hex[:8]}"
    bob = Browser(url)
    try:
        assert bob.sign_in(key_of(secrets, "bob"))
        bob.ask(marker)
    finally:
        bob.close()
    return marker


def test_a_removed_user_cannot_sign_in_and_bobs_chats_survive_a_restart_and_a_converge(office):
    state, inventory, secrets, url = office
    marker = bob_says(url, secrets, "remember")
    alice_key = key_of(secrets, "alice")
    assert sparkfleet("users", "remove", inventory, "alice").returncode == 0
    try:
        done = converge("--limit", DOOR, inventory=inventory)
        assert done.returncode == 0, done.output[-4000:]
        alice = Browser(url)
        try:
            assert not alice.sign_in(alice_key)
        finally:
            alice.close()
        # bob's chat after the UI's host restarts (a reboot: the unit starts at boot) and a converge
        from sim import fleet

        fleet.reboot(UI_HOST)
        wait_until(lambda: ssh(state, UI_HOST, f"systemctl is-active {paths.CHAT_UI_UNIT_NAME}",
                               check=False).strip() == "active", 300, "the chat UI is back after the reboot")
        wait_until(lambda: requests.get(f"{url}{chat_ui.LOGIN_PATH}", timeout=5).ok, 60, "the door")
        wait_until(lambda: any(marker in c for c in bobs_chats(url, key_of(secrets, "bob"))), 300,
                   "bob's chat after the reboot", ignore=(requests.RequestException, ValueError, KeyError, TypeError))
        again = converge(inventory=inventory)
        assert again.returncode == 0, again.output[-4000:]
        assert any(marker in c for c in bobs_chats(url, key_of(secrets, "bob")))
    finally:  # alice back for the other tests (a new key: `users add`)
        sparkfleet("users", "add", inventory, "alice")
        sparkfleet("users", "limit", inventory, "alice", "--requests-per-minute", "3")
        converge("--limit", DOOR, inventory=inventory)


def test_the_ui_is_reached_only_through_the_door_and_a_forged_identity_is_refused(office):
    state, inventory, secrets, url = office
    from sparkfleet.contract.paths import engine_port  # where Open WebUI listens on its host's loopback

    # from another simulated host: Open WebUI's own port is loopback-only, its guard wants a door's key
    direct = ssh(state, "spark-2", f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 5 "
                                   f"http://{container(UI_HOST)}:{engine_port(8095)}/api/version", check=False)
    assert direct.strip() in ("000", ""), direct  # nothing listens there beyond loopback
    guarded = ssh(state, "spark-2", "curl -s -o /dev/null -w '%{http_code}' --max-time 5 "
                                    f"-H '{chat_ui.EMAIL_HEADER}: bob@{chat_ui.EMAIL_DOMAIN}' "
                                    f"http://{container(UI_HOST)}:8095/api/v1/chats/", check=False)
    assert guarded.strip() == "401", guarded
    # the door's API with a forged identity token and no valid signature
    forged = requests.post(
        f"http://{door_address()}:8080/v1/chat/completions", timeout=30,
        headers={"Authorization": f"Bearer {chat_ui.ui_key('sim-key')}",
                 chat_ui.JWT_HEADER: "eyJhbGciOiJIUzI1NiJ9.eyJlbWFpbCI6ImJvYkBzcGFya2ZsZWV0LmludmFsaWQifQ.AAAA"},
        json={"model": "Qwen3.5-35B-A3B", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    assert forged.status_code == 401, forged.text


def test_the_chat_ui_hosts_testinfra_checks_pass(office):
    """tests/infra/test_chat_ui.py against this module's inventory (the session's has no chat UI): among them, no
    TCP port where Open WebUI listened, and its socket out of reach of an unprivileged local process."""
    state, inventory, secrets, url = office
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/infra/test_chat_ui.py", "--inventory", inventory,
                           "-q", "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and " skipped" not in proc.stdout, proc.stdout[-2000:]


def running_image(state) -> str:
    return ssh(state, UI_HOST, f"docker inspect -f '{{{{.Image}}}}' {paths.CHAT_UI_CONTAINER}").strip()


def test_a_version_change_keeps_bobs_chats_and_a_rollback_restores_the_previous_version_with_them(office, tmp_path):
    state, inventory, secrets, url = office
    marker = bob_says(url, secrets, "before the upgrade")
    before = running_image(state)
    upgraded = write_inventory(tmp_path, secrets, NEXT, "next_office.py")
    try:
        done = converge("--limit", UI_HOST, inventory=upgraded)
        assert done.returncode == 0, done.output[-4000:]
        assert running_image(state) != before
        kept = ssh(state, UI_HOST, f"ls {paths.CHAT_UI_BACKUPS}").split()
        assert kept, "no copy of the database kept before the version change"
        wait_until(lambda: any(marker in c for c in bobs_chats(url, key_of(secrets, "bob"))), 120,
                   "bob's chat on the new version", ignore=(requests.RequestException, ValueError, KeyError, TypeError))
    finally:  # the rollback: the previous version, with its database as it left it
        back = converge("--limit", UI_HOST, inventory=inventory)
    assert back.returncode == 0, back.output[-4000:]
    assert running_image(state) == before
    wait_until(lambda: any(marker in c for c in bobs_chats(url, key_of(secrets, "bob"))), 120,
               "bob's chat after the rollback", ignore=(requests.RequestException, ValueError, KeyError, TypeError))


# --- login CSRF: another site's page neither signs a person in as someone else nor out (issue 50) ----------------

def door_cookie(browser: Browser) -> str | None:
    """The door's cookie in this browser (HttpOnly: WebDriver reads it, a page's script cannot), None without one."""
    browser.driver.get(browser.url + chat_ui.LOGIN_PATH)
    found = browser.driver.get_cookie(chat_ui.COOKIE)
    return found["value"] if found else None


def test_another_sites_form_neither_signs_alice_in_as_bob_nor_signs_her_out(office):
    """alice, signed in, opens pages of another site: one auto-submits bob's key to the door's sign-in (his page
    would switch her into his account, her next messages stored where he reads them), one a form to the sign-out,
    one sends her to the sign-out path. She stays alice. Her own sign-out (Open WebUI's leads to the door's page,
    whose button posts it) signs her out."""
    from selenium.webdriver.common.by import By

    state, inventory, secrets, url = office
    alice_key, bob_key = key_of(secrets, "alice"), key_of(secrets, "bob")
    login, logout = url + chat_ui.LOGIN_PATH, url + chat_ui.LOGOUT_PATH
    pages = {"/sign-in-as-bob": ATTACKER_FORM.format(action=login, key=bob_key),
             "/sign-out": ATTACKER_FORM.format(action=logout, key=""),
             "/link-to-sign-out": f'<!doctype html><script>location.href = "{logout}"</script>'}
    alice = Browser(url)
    try:
        assert alice.sign_in(alice_key)
        with another_site(pages) as site:
            for attack in pages:
                alice.driver.get(site + attack)
                wait_until(lambda: alice.driver.current_url.startswith(url), 30, f"{attack}: the door's answer")
                assert door_cookie(alice) == alice_key, attack
        alice.driver.get(url + "/")
        wait_until(lambda: alice.driver.find_elements(By.ID, "chat-input"), SIGN_IN_S, "alice's chat, still open")
        # Open WebUI's own sign-out sends the browser to the door's sign-out page
        with requests.Session() as s:
            s.cookies.set(chat_ui.COOKIE, alice_key)
            token = s.post(f"{url}/api/v1/auths/signin", json={"email": "", "password": ""}, timeout=30).json()["token"]
            out = s.post(f"{url}/api/v1/auths/signout", headers={"Authorization": f"Bearer {token}"}, timeout=30)
            assert out.json().get("redirect_url") == chat_ui.LOGOUT_PATH, out.text
        alice.driver.get(logout + "?state=logout")
        assert door_cookie(alice) == alice_key  # the page itself signs nobody out
        alice.driver.get(logout)
        alice.driver.find_element(By.ID, "sign-out").click()
        wait_until(lambda: alice.driver.get_cookie(chat_ui.COOKIE) is None, 30, "alice signed out by her own button")
        alice.driver.get(url + "/")
        assert alice.driver.current_url.endswith(chat_ui.LOGIN_PATH), alice.driver.current_url
    finally:
        alice.close()



# --- the drill: nothing the office made is lost (issue 53, docs/backups.md) ---------------------------------------
# Last in the module: it leaves the chat UI on spark-2, and the module's teardown converges the fleet without it.

def backup_password() -> Path:
    """The sim fleet's backup password (inventory/sim.py makes it once, beside its CA): what an office wrote down."""
    return CONFIG / f"sim-{os.environ.get('SPARKFLEET_SIM_FLEET') or 'default'}.backup-password"


def fleet_ca() -> list[Path]:
    return [CONFIG / f"sim-{os.environ.get('SPARKFLEET_SIM_FLEET') or 'default'}.ca.{ext}" for ext in ("crt", "key")]


def bob_keeps(url: str, key: str, marker: str) -> None:
    """bob saves a chat of his through the door (his key in its cookie, Open WebUI's session)."""
    with requests.Session() as s:
        s.cookies.set(chat_ui.COOKIE, key)
        token = s.post(f"{url}/api/v1/auths/signin", json={"email": "", "password": ""}, timeout=30).json()["token"]
        saved = s.post(f"{url}/api/v1/chats/new", headers={"Authorization": f"Bearer {token}"}, timeout=30,
                       json={"chat": {"title": marker, "messages": [{"role": "user", "content": marker}]}})
        assert saved.ok, saved.text


def answers(key: str) -> int:
    """A plain chat through the door's API with a person's key: its status."""
    return requests.post(f"http://{door_address()}:8080/v1/chat/completions", timeout=60,
                         headers={"Authorization": f"Bearer {key}"},
                         json={"model": "Qwen3.5-35B-A3B", "messages": [{"role": "user", "content": "hi"}],
                               "max_tokens": 1}).status_code


def test_the_drill_the_controller_and_the_chat_ui_s_spark_lost_and_everything_back_from_the_backup(office, tmp_path):
    """An office's two losses, from one `sparkfleet backup`: the controller's keys and CA (a laptop lost), restored
    with the written-down password, after which a converge changes nothing and every key answers; then the chat UI's
    Spark (powered off): the chat UI moved to spark-2 in the inventory, converged without spark-1, restored there,
    bob's chat and usage his; spark-1 back, the fleet converges with the chat UI staying on spark-2."""
    from sim import fleet

    state, inventory, secrets, url = office
    bob = key_of(secrets, "bob")
    marker = f"kept through the loss {uuid.uuid4().hex[:8]}"
    bob_keeps(url, bob, marker)
    counted = usage(inventory).get("bob", 0)
    written_down = tmp_path / "written-down"
    written_down.write_bytes(backup_password().read_bytes())
    written_down.chmod(0o600)
    done = sparkfleet("backup", inventory)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    # the controller lost: its secrets file and the fleet CA gone
    kept = {p: p.read_bytes() for p in (secrets, *fleet_ca())}
    try:
        for path in kept:
            path.unlink()
        dry = sparkfleet("restore", inventory, "controller", "--password-file", str(written_down))
        assert dry.returncode == 0 and str(secrets) in dry.stdout, dry.stdout + dry.stderr
        assert not secrets.exists()  # without --yes: what it would write, nothing written
        back = sparkfleet("restore", inventory, "controller", "--password-file", str(written_down), "--yes")
        assert back.returncode == 0, back.stdout[-3000:] + back.stderr[-3000:]
        assert {p: p.read_bytes() for p in kept} == kept  # byte for byte
        assert [oct(p.stat().st_mode & 0o777) for p in (secrets, fleet_ca()[1])] == ["0o600", "0o600"]
    finally:  # whatever happened, the fleet's CA and keys as they were (the next modules' hosts chain to the CA)
        for path, content in kept.items():
            if not path.exists() or path.read_bytes() != content:
                write_private(path, content)
    again = converge(inventory=inventory)
    assert again.returncode == 0, again.output[-4000:]
    assert {h: ops for h, ops in again.changed.items() if ops} == {}
    assert {name: answers(key_of(secrets, name)) for name in ("alice", "bob")} == {"alice": 200, "bob": 200}

    # the chat UI's Spark lost: the office moves it to spark-2, converges without spark-1, restores there
    moved = write_inventory(tmp_path, secrets, name="moved_office.py", ui_host=NEW_UI_HOST, lost=(UI_HOST,))
    fleet.stop_host(UI_HOST)
    try:
        up = converge(inventory=moved)
        assert up.returncode == 0, up.output[-4000:]
        # a new, empty chat UI on spark-2, once the door finds it up
        wait_until(lambda: not any(marker in c for c in bobs_chats(url, bob)), 120, "the new chat UI on spark-2",
                   ignore=(requests.RequestException, ValueError, KeyError, TypeError))
        dry = sparkfleet("restore", moved, "chat-ui")
        assert dry.returncode == 0 and NEW_UI_HOST in dry.stdout, dry.stdout + dry.stderr
        restored = sparkfleet("restore", moved, "chat-ui", "--yes")
        assert restored.returncode == 0, restored.stdout[-3000:] + restored.stderr[-3000:]
        wait_until(lambda: any(marker in c for c in bobs_chats(url, bob)), 120, "bob's chat restored on spark-2",
                   ignore=(requests.RequestException, ValueError, KeyError, TypeError))
        assert usage(moved).get("bob", 0) >= counted  # his usage is still his (the door's, never lost)
    finally:
        fleet.start_host(UI_HOST)
    # spark-1 back in the inventory: the fleet converges, the chat UI stays on spark-2 (spark-1's is removed)
    returned = converge(inventory=write_inventory(tmp_path, secrets, name="returned_office.py", ui_host=NEW_UI_HOST))
    assert returned.returncode == 0, returned.output[-4000:]
    assert ssh(state, UI_HOST, f"systemctl is-active {paths.CHAT_UI_UNIT_NAME}", check=False).strip() != "active"
    assert any(marker in c for c in bobs_chats(url, bob))
