"""Another site for the login-CSRF tests (issue 50): a page on an origin other than the door's that posts a form
to the door as soon as a browser opens it. The unit tests (the real HAProxy and Chromium on loopback) and the e2e
chat UI module (the sim's door) both serve it from here."""

from __future__ import annotations

import contextlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ATTACKER_FORM = """<!doctype html><html><body>
<form method="post" action="{action}"><input name="key" value="{key}"></form>
<script>document.forms[0].submit()</script></body></html>"""


@contextlib.contextmanager
def another_site(pages: dict[str, str], address: str = "127.0.0.1"):
    """`pages` (path -> HTML) served from `address` on a free port, an origin other than the door's: its URL."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = pages[self.path].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer((address, 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://{address}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
