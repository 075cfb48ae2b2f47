"""How the controller asks the guards over the LAN: the one place that builds its HTTP session (and the ssl context
for the clients that take one), so status, bench, the gates and the tests all present the same client certificate
and verify the guard the same way.

Where the fleet's hops are TLS (`release/plan.py` `fleet_tls`), the controller issues itself a client certificate
in memory from the fleet CA (roles/pki.py `client_pair`, one day), writes it only into a private 0700 temporary
directory for the life of the client, and verifies each guard's chain with the CA and its name: the guard's
certificate must name the inventory host (`assert_hostname`), whatever address the controller reaches it at (a
published port, a tunnel). Without TLS it is a plain session, as before.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import requests
from requests.adapters import HTTPAdapter

from sparkfleet.contract.reach import api_url
from sparkfleet.contract.settings import Settings
from sparkfleet.roles import pki


class _Named(HTTPAdapter):
    """An adapter that checks the guard's certificate names `name` (the inventory host), not the URL's host."""

    def __init__(self, name: str):
        self._name = name
        super().__init__()

    def init_poolmanager(self, *args, **kwargs):
        kwargs["assert_hostname"] = self._name
        super().init_poolmanager(*args, **kwargs)


@dataclass
class GuardClient:
    """The controller's client of the guards: `session` for requests, `url` for a host's API (mounting the name
    check for it), `ssl_context` for a client that takes one (httpx, openai)."""

    session: requests.Session
    files: tuple[str, str, str] | None = None  # (CA, certificate, key) in the private directory; None: plain http
    _mounted: set = field(default_factory=set)

    @property
    def tls(self) -> bool:
        return self.files is not None

    def url(self, name: str, s: Settings, data: dict) -> str | None:
        url = api_url(name, s, data, tls=self.tls)
        if url and self.tls and url not in self._mounted:
            self.session.mount(url + "/", _Named(name))
            self._mounted.add(url)
        return url

    def ssl_context(self, check_hostname: bool = True) -> ssl.SSLContext | None:
        """The same trust and client certificate as an ssl context; None without TLS. `check_hostname` False only
        for a client that cannot be told the name to check (the chain is still the fleet CA's)."""
        if not self.files:
            return None
        ctx = ssl.create_default_context(cafile=self.files[0])
        ctx.load_cert_chain(self.files[1], self.files[2])
        ctx.check_hostname = check_hostname
        return ctx


@contextmanager
def guard_client(ca: pki.FleetCA | None):
    """A GuardClient for the life of the block: plain without a CA; else the CA, a fresh one-day client certificate
    and its key in a new 0700 directory (the key 0600 from its first byte), removed when the block ends."""
    session = requests.Session()
    if ca is None:
        with session:
            yield GuardClient(session)
        return
    cert_pem, key_pem = pki.client_pair(ca)
    with tempfile.TemporaryDirectory(prefix="sparkfleet-tls-") as tmp, session:
        ca_file, cert_file, key_file = (str(Path(tmp) / n) for n in ("ca.crt", "client.crt", "client.key"))
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(key_pem)
        Path(ca_file).write_text(ca.cert_pem)
        Path(cert_file).write_text(cert_pem)
        session.verify, session.cert = ca_file, (cert_file, key_file)
        session.trust_env = False  # else REQUESTS_CA_BUNDLE (or CURL_CA_BUNDLE) replaces `verify`, and a proxy
        #                            from the environment would stand between the controller and the guard
        yield GuardClient(session, (ca_file, cert_file, key_file))
