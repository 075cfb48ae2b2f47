"""The chat UI's door against hostile pages and clients (issue 50: login CSRF, the door's cookie, forwarded
headers), on the real HAProxy with the rendered config, plain and over TLS: a sign-in or sign-out sent from another
site's page sets and clears no cookie, a GET signs nobody out, the door's cookie named twice is refused and never
reaches Open WebUI, over TLS it is a `__Host-` cookie, and a client's forwarded headers reach no backend."""

from __future__ import annotations

import contextlib
import datetime
import http.client
import ipaddress
import shutil
import ssl
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

import pytest

from sparkfleet.contract import paths
from sparkfleet.roles import chat_ui
from sparkfleet.roles.front_door import plan as fd_plan

from tests.conftest import free_port
from tests.cross_site import ATTACKER_FORM, another_site
from tests.tiers import needs
from .helpers import ROOT, door_files, wait_for
from .test_front_door import plans

ALICE, BOB = "alice-key-0123456789abcdef", "bob-key-0123456789abcdef"
# what a client may claim about where it is and how it came: none of it may reach a backend
FORGED = [("X-Forwarded-For", "203.0.113.7"), ("X-Forwarded-For", "198.51.100.1"), ("X-Forwarded-Proto", "https"),
          ("X-Forwarded-Host", "evil.example"), ("X-Forwarded-Port", "443"), ("X-Real-IP", "203.0.113.7"),
          ("Forwarded", "for=203.0.113.7;proto=https;host=evil.example")]
FORWARDING = {"x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "x-forwarded-port", "x-real-ip", "forwarded"}


class Backend:
    """A loopback HTTP server that answers 200 to anything and records each request's header lines as they came
    (a header sent twice stays twice): Open WebUI's or an engine's place behind the door."""

    def __init__(self):
        seen = self.seen = []

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                seen.append((self.command, self.path, [(k.lower(), v) for k, v in self.headers.items()]))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            do_GET = do_POST = do_HEAD = _answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def request(self, path: str) -> list[tuple[str, str]]:
        """The header lines of the one request for `path` (a test's own, unique path)."""
        found = [headers for _, p, headers in self.seen if p == path]
        assert len(found) == 1, (path, [p for _, p, _ in self.seen])
        return found[0]

    def asked(self, path: str) -> bool:
        return any(p == path for _, p, _ in self.seen)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Door:
    page: int  # the chat UI's port
    api: int  # the API's
    tls: bool
    ui: Backend
    engine: Backend
    context: ssl.SSLContext | None

    @property
    def origin(self) -> str:
        """This door's own origin as a browser names it (scheme, host, port)."""
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.page}"

    @property
    def cookie(self) -> str:
        return chat_ui.cookie_name(self.tls)


@dataclass
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    @property
    def cookies_set(self) -> list[str]:
        return self.headers.get_all("Set-Cookie") or []


def send(door: Door, method: str, path: str, headers=(), body: str | None = None, port: int | None = None) -> Answer:
    """One request with exactly these header lines (a name may repeat), as a browser or a hand-made client sends it."""
    port = port or door.page
    conn = (http.client.HTTPSConnection("127.0.0.1", port, context=door.context, timeout=10) if door.tls else
            http.client.HTTPConnection("127.0.0.1", port, timeout=10))
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for name, value in headers:
            conn.putheader(name, value)
        data = body.encode() if body is not None else None
        if data is not None:
            conn.putheader("Content-Type", "application/x-www-form-urlencoded")
            conn.putheader("Content-Length", str(len(data)))
        conn.endheaders(data)
        answer = conn.getresponse()
        return Answer(answer.status, answer.headers, answer.read())
    finally:
        conn.close()


def sign_in(door: Door, key: str, headers=()) -> Answer:
    return send(door, "POST", chat_ui.LOGIN_PATH, headers, f"key={quote(key, safe='')}")


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (the office's own, as `sparkfleet init` may make one)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "front door")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "door.crt", directory / "door.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@contextlib.contextmanager
def running_door(tmp: Path, tls: bool):
    """The rendered door with a chat UI, its engine and Open WebUI both recording backends on loopback."""
    ui_backend, engine = Backend(), Backend()
    api, page = free_port(), free_port()
    over = {"lan_address": "127.0.0.1", "front_door_port": api, "chat_ui_port": page,
            "front_door_users": {"alice": ALICE, "bob": BOB}}
    context = None
    if tls:
        cert, key = _self_signed(tmp)
        over |= {"front_door_tls_cert": str(cert), "front_door_tls_key": str(key)}
        context = ssl.create_default_context(cafile=str(cert))
    ps = plans(**{"spark-a": over, "spark-b": over})
    ui = chat_ui.chat_ui_plan(["spark-b"], ps)
    ui = chat_ui.ChatUi(ui.host, "127.0.0.1", ui.settings.model_copy(update={"chat_ui_host_port": ui_backend.port}))
    planned = fd_plan.front_door_plan("spark-a", ps, ui=ui)
    planned = fd_plan.FrontDoor(planned.host, planned.settings, (fd_plan.Backend("spark-a", "127.0.0.1", engine.port),),
                                planned.api_key, chat_ui=ui)
    door_files(planned, tmp)
    (tmp / Path(paths.FRONT_DOOR_CHAT_UI_USERS).name).write_text(planned.chat_ui_users_map())
    (tmp / Path(paths.FRONT_DOOR_LOGIN_PAGE).name).write_text((ROOT / "files" / "chat-ui-login.html").read_text())
    (tmp / "secrets.cfg").write_text(planned.secrets_config())
    if tls:
        (tmp / Path(paths.FRONT_DOOR_TLS_PEM).name).write_text(planned.tls_pem())
    moved = {paths.FRONT_DOOR_DIR: str(tmp), paths.FRONT_DOOR_SOCKET: str(tmp / "admin.sock"),
             paths.FRONT_DOOR_STATE_FILE: str(tmp / "state"), f"bind :{api}": f"bind 127.0.0.1:{api}",
             f"bind :{page}": f"bind 127.0.0.1:{page}", paths.FRONT_DOOR_USAGE_SNAPSHOT: str(tmp / "usage.snapshot")}
    config = planned.config()
    for old, new in moved.items():
        config = config.replace(old, new)
    config = "\n".join(line for line in config.splitlines()
                       if line.split()[:1] not in (["user"], ["group"], ["chroot"])) + "\n"
    (tmp / "haproxy.cfg").write_text(config)
    args = ["-f", str(tmp / "secrets.cfg"), "-f", str(tmp / "haproxy.cfg")]
    check = subprocess.run(["haproxy", "-c", *args], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    proc = subprocess.Popen(["haproxy", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    door = Door(page, api, tls, ui_backend, engine, context)
    try:
        wait_for(lambda: send(door, "GET", "/health", port=api).status == 200)
        yield door
    finally:
        proc.terminate()
        proc.wait()
        ui_backend.close()
        engine.close()


@pytest.fixture(scope="module")
@needs("haproxy")
def plain(tmp_path_factory):
    with running_door(tmp_path_factory.mktemp("door-http"), tls=False) as door:
        yield door


@pytest.fixture(scope="module")
@needs("haproxy")
def over_tls(tmp_path_factory):
    with running_door(tmp_path_factory.mktemp("door-https"), tls=True) as door:
        yield door


@pytest.fixture(params=["http", "https"])
def door(request):
    """Each test against the door over plain http and over TLS."""
    return request.getfixturevalue("plain" if request.param == "http" else "over_tls")


def unique(prefix: str = "/api/chats") -> str:
    return f"{prefix}?n={uuid.uuid4().hex}"


# --- login CSRF: only the door's own page signs a browser in or out ------------------------------------------------

CROSS_SITE = [
    ("another site's form (the browser's own words)", [("Sec-Fetch-Site", "cross-site"),
                                                       ("Origin", "http://evil.example")]),
    ("another site, no Origin", [("Sec-Fetch-Site", "cross-site")]),
    ("a neighbouring site (another port or subdomain)", [("Sec-Fetch-Site", "same-site"),
                                                          ("Origin", "http://127.0.0.1:1")]),
    ("a foreign Origin alone (an older browser)", [("Origin", "http://evil.example")]),
    ("a sandboxed or privacy-stripped page", [("Origin", "null")]),
    ("the door's name but another scheme", [("Sec-Fetch-Site", "same-origin"), ("Origin", "{other_scheme}")]),
    ("the door's own Origin, but the browser says cross-site", [("Sec-Fetch-Site", "cross-site"),
                                                                ("Origin", "{origin}")]),
    ("Sec-Fetch-Site twice", [("Sec-Fetch-Site", "same-origin"), ("Sec-Fetch-Site", "cross-site")]),
    ("Origin twice", [("Origin", "{origin}"), ("Origin", "http://evil.example")]),
]


def _headers(door: Door, headers) -> list[tuple[str, str]]:
    other = door.origin.replace("https://", "http://") if door.tls else door.origin.replace("http://", "https://")
    return [(k, v.format(origin=door.origin, other_scheme=other)) for k, v in headers]


@pytest.mark.parametrize("why, headers", CROSS_SITE, ids=[w for w, _ in CROSS_SITE])
def test_a_sign_in_sent_from_another_sites_page_sets_no_cookie(door, why, headers):
    """A colleague's page posting his own key would switch this browser into his account (what she types next,
    stored where he reads it): refused, no cookie of any kind set."""
    answer = sign_in(door, BOB, _headers(door, headers))
    assert answer.status == 403, (why, door.tls, answer.status)
    assert not answer.cookies_set, (why, answer.cookies_set)


@pytest.mark.parametrize("why, headers", [
    ("the door's own page", [("Sec-Fetch-Site", "same-origin"), ("Origin", "{origin}")]),
    ("typed or bookmarked (no page sent it)", [("Sec-Fetch-Site", "none")]),
    ("a client that is no browser (curl, a script)", []),
])
def test_a_sign_in_from_the_doors_own_page_or_a_plain_client_sets_the_cookie(door, why, headers):
    answer = sign_in(door, ALICE, _headers(door, headers))
    assert answer.status == 303 and answer.headers["Location"] == "/", (why, answer.status)
    assert any(c.startswith(f"{door.cookie}={ALICE};") for c in answer.cookies_set), answer.cookies_set


def test_a_get_to_the_sign_out_path_clears_nothing_and_offers_the_form(door):
    """A link or an image from anywhere used to sign a person out: now the path shows the door's page, whose
    button posts the sign-out."""
    cookie = [("Cookie", f"{door.cookie}={ALICE}")]
    for method in ("GET", "HEAD"):
        answer = send(door, method, chat_ui.LOGOUT_PATH + "?state=logout", cookie)
        assert answer.status == 200 and not answer.cookies_set, (method, answer.status, answer.cookies_set)
    page = send(door, "GET", chat_ui.LOGOUT_PATH, cookie).body.decode()
    assert f'method="post" action="{chat_ui.LOGOUT_PATH}"' in page and 'id="sign-out"' in page


@pytest.mark.parametrize("why, headers", CROSS_SITE, ids=[w for w, _ in CROSS_SITE])
def test_a_sign_out_sent_from_another_sites_page_clears_nothing(door, why, headers):
    cookie = [("Cookie", f"{door.cookie}={ALICE}")]
    answer = send(door, "POST", chat_ui.LOGOUT_PATH, cookie + _headers(door, headers), "")
    assert answer.status == 403 and not answer.cookies_set, (why, answer.status, answer.cookies_set)


def test_the_sign_out_button_on_the_doors_page_clears_the_cookie(door):
    mine = [("Cookie", f"{door.cookie}={ALICE}"), ("Sec-Fetch-Site", "same-origin"), ("Origin", door.origin)]
    answer = send(door, "POST", chat_ui.LOGOUT_PATH, mine, "")
    assert answer.status == 303 and answer.headers["Location"] == chat_ui.LOGIN_PATH
    cleared = [c for c in answer.cookies_set if c.startswith(f"{door.cookie}=;")]
    assert cleared and "Max-Age=0" in cleared[0] and "Path=/" in cleared[0]
    if door.tls:  # a __Host- cookie is replaced (here: removed) only by one that keeps its rules
        assert "Secure" in cleared[0] and "Domain" not in cleared[0]
    for method in ("PUT", "DELETE"):
        assert not send(door, method, chat_ui.LOGOUT_PATH, mine, "").cookies_set


# --- the door's cookie: once, never past the door, __Host- over TLS ------------------------------------------------

TWICE = [
    ("twice in one line", ["{c}=" + ALICE + "; {c}=" + BOB]),
    ("twice, comma-separated", ["{c}=" + ALICE + ", {c}=" + BOB]),
    ("in two Cookie lines", ["a=1; {c}=" + ALICE, "{c}=" + BOB + "; b=2"]),
    ("once more in another case", ["{c}=" + ALICE + "; " + "SPARKFLEET_KEY=" + BOB]),
    ("hidden from HAProxy's parser in a quoted value", ['z=w", {c}=' + BOB + '; a="q; {c}=' + ALICE]),
    ("the same key twice", ["{c}=" + ALICE + "; {c}=" + ALICE]),
]


@pytest.mark.parametrize("why, lines", TWICE, ids=[w for w, _ in TWICE])
def test_the_doors_cookie_named_twice_is_refused_and_reaches_nothing(door, why, lines):
    """A cookie tossed from a neighbouring site beside the person's own would choose who is asking (the last one
    counted) and carry a key past the door: a request naming the door's cookie twice is refused."""
    path = unique()
    headers = [("Cookie", line.format(c=door.cookie)) for line in lines]
    assert send(door, "GET", path, headers).status == 400, (why, door.tls)
    assert not door.ui.asked(path)


@pytest.mark.parametrize("why, lines", [
    ("alone", ["{c}=" + ALICE]),
    ("first", ["{c}=" + ALICE + "; a=1; b=2"]),
    ("between two", ["a=1; {c}=" + ALICE + "; b=2"]),
    ("last", ["a=1; b=2; {c}=" + ALICE]),
    ("comma-separated, between two", ["a=1, {c}=" + ALICE + ", b=2"]),
    ("spaces around its =", ["a=1; {c} = " + ALICE + " ; b=2"]),
    ("in a second Cookie line", ["a=1", "b=2; {c}=" + ALICE]),
    ("in the first of two Cookie lines", ["{c}=" + ALICE + "; a=1", "b=2"]),
])
def test_the_doors_cookie_is_stripped_wherever_it_stands(door, why, lines):
    """Open WebUI never sees the key, whatever its place in the Cookie header(s); its own cookies pass."""
    path = unique()
    headers = [("Cookie", line.format(c=door.cookie)) for line in lines]
    assert send(door, "GET", path, headers).status == 200, (why, door.tls)
    seen = door.ui.request(path)
    assert ("x-sparkfleet-user-email", "alice@sparkfleet.invalid") in seen
    cookies = " ".join(v for k, v in seen if k == "cookie")
    assert ALICE not in str(seen) and "sparkfleet_key" not in cookies.lower(), (why, seen)
    assert "a=1" in cookies and "b=2" in cookies or why in ("alone",), (why, cookies)


def test_over_tls_the_cookie_is_a_host_cookie_and_the_plain_name_opens_nothing(over_tls):
    """`__Host-`: a browser keeps it only Secure, for Path=/ and without a Domain, so no neighbouring site can
    set one beside it; the name without the prefix (what a site on another subdomain could toss) is nobody."""
    assert chat_ui.cookie_name(True) == "__Host-" + chat_ui.COOKIE and chat_ui.cookie_name(False) == chat_ui.COOKIE
    set_cookie = next(c for c in sign_in(over_tls, ALICE).cookies_set if c.startswith(f"__Host-{chat_ui.COOKIE}="))
    attributes = [a.strip() for a in set_cookie.split(";")[1:]]
    assert {"Path=/", "HttpOnly", "SameSite=Strict", "Secure"} <= set(attributes)
    assert not [a for a in attributes if a.lower().startswith("domain")]
    # the sign-in clears a cookie of the plain name, which an http door's earlier sign-in may have left
    assert any(c.startswith(f"{chat_ui.COOKIE}=;") and "Max-Age=0" in c for c in sign_in(over_tls, ALICE).cookies_set)
    path = unique()
    assert send(over_tls, "GET", path, [("Cookie", f"{chat_ui.COOKIE}={ALICE}")]).status == 401
    assert not over_tls.ui.asked(path)
    path = unique()
    both = [("Cookie", f"{chat_ui.COOKIE}={BOB}; __Host-{chat_ui.COOKIE}={ALICE}")]
    assert send(over_tls, "GET", path, both).status == 400 and not over_tls.ui.asked(path)


# --- forwarded headers: the door is their only author ---------------------------------------------------------------

def test_a_clients_forwarded_headers_never_reach_open_webui_the_door_writes_its_own(door):
    """Open WebUI's server trusts X-Forwarded-For and -Proto from its proxy: it must read where the client really
    is and how it came (the door's one line each), never what the client claimed."""
    path = unique()
    assert send(door, "GET", path, [("Cookie", f"{door.cookie}={ALICE}"), *FORGED]).status == 200
    seen = door.ui.request(path)
    forwarded = sorted((k, v) for k, v in seen if k in FORWARDING)
    assert forwarded == [("x-forwarded-for", "127.0.0.1"), ("x-forwarded-proto", "https" if door.tls else "http")]


def test_a_clients_forwarded_headers_never_reach_an_engine(plain):
    path = unique("/v1/models")
    assert send(plain, "GET", path, [("Authorization", f"Bearer {ALICE}"), *FORGED], port=plain.api).status == 200
    assert not [k for k, _ in plain.engine.request(path) if k in FORWARDING]


# --- a real browser: the cross-site form does nothing, the door's own page still works -----------------------------

def _browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    driver_path = shutil.which("chromedriver")
    if driver_path is None:
        pytest.skip("needs chromedriver (Selenium's driver of Chromium): apt-get install chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver_path), options=options)


def _landed(driver, url: str, timeout: float = 20) -> None:
    """Until the browser shows a page of `url` (a submitted form's answer)."""
    deadline = time.monotonic() + timeout
    while not driver.current_url.startswith(url):
        assert time.monotonic() < deadline, f"the browser stayed on {driver.current_url}"
        time.sleep(0.1)
    driver.find_element("tag name", "body")


@pytest.mark.chromium
def test_in_a_real_browser_another_sites_form_leaves_the_persons_cookie_alone(plain):
    """Chromium, signed in as alice through the door's page, opens pages of other sites (another address, and the
    door's own address on another port) that auto-submit bob's key to the sign-in and a form to the sign-out, and
    follows a link to the sign-out: alice stays alice. Her own sign-out button signs her out."""
    door_url = f"http://127.0.0.1:{plain.page}"
    login, logout = door_url + chat_ui.LOGIN_PATH, door_url + chat_ui.LOGOUT_PATH
    pages = {"/sign-in": ATTACKER_FORM.format(action=login, key=BOB),
             "/sign-out": ATTACKER_FORM.format(action=logout, key=""),
             "/link": f'<!doctype html><script>location.href = "{logout}"</script>'}
    driver = _browser()
    try:
        from selenium.webdriver.common.by import By

        driver.get(login)
        driver.find_element(By.ID, "key").send_keys(ALICE)
        driver.find_element(By.ID, "sign-in").click()
        wait_for(lambda: (driver.get_cookie(plain.cookie) or {}).get("value") == ALICE)
        # another loopback address is another site for the browser; another port of the door's, a neighbouring one
        with another_site(pages, "127.0.0.2") as other, another_site(pages) as neighbour:
            for site in (other, neighbour):
                for attack in ("/sign-in", "/sign-out", "/link"):
                    driver.get(site + attack)
                    _landed(driver, door_url)
                    driver.get(login)
                    cookie = driver.get_cookie(plain.cookie)
                    assert cookie and cookie["value"] == ALICE, (site, attack, cookie)
        path = unique("/")
        driver.get(door_url + path)
        assert ("x-sparkfleet-user-email", "alice@sparkfleet.invalid") in plain.ui.request(path)
        driver.get(logout)
        driver.find_element(By.ID, "sign-out").click()
        wait_for(lambda: driver.get_cookie(plain.cookie) is None)
    finally:
        driver.quit()


def test_open_webuis_own_sign_out_leads_to_the_doors_sign_out_page():
    """Open WebUI's "Sign out" alone would leave the door's cookie (the next page signs the person in again): it
    ends on the door's page, whose button signs the browser out."""
    ps = plans(**{"spark-a": {}, "spark-b": {}})
    ui = chat_ui.chat_ui_plan(["spark-b"], ps)
    env = chat_ui.env_file(ui, chat_ui.door_endpoint([ps["spark-a"]]), "m")
    assert f"\nWEBUI_AUTH_SIGNOUT_REDIRECT_URL={chat_ui.LOGOUT_PATH}\n" in env
