"""A screenshot of the office status page, taken by the distribution's Chromium, headless.

    python -m tools.status_page_shot URL OUT.png [--user VIEWER] [--password-file FILE] [--ca PEM] [--size WxH]

URL is the page, e.g. http://door.lan:8080/status. A viewer's password is read from --password-file, or from
SPARKFLEET_VIEWER_PASSWORD, never from the command line: the tool serves the page to Chromium from a loopback
proxy of its own that adds the Authorization header, so neither Chromium's command line, its profile nor its
history ever holds the password. The proxy answers GET of that one page only, and dies with the tool.
"""

from __future__ import annotations

import argparse
import base64
import os
import shutil
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

PASSWORD_ENV = "SPARKFLEET_VIEWER_PASSWORD"
MAX_BODY = 16 * 1024 * 1024  # what the proxy passes on of one answer
TIMEOUT_S = 90


@contextmanager
def authorized(url: str, user: str | None, password: str | None, ca: str | None = None):
    """A loopback URL serving `url` (that page alone) with the viewer's Basic auth added; yields it."""
    target = urlsplit(url)
    if target.scheme not in ("http", "https") or not target.netloc:
        raise ValueError(f"{url!r} is not an http(s) URL")
    origin = f"{target.scheme}://{target.netloc}"
    page = (target.path or "/") + (f"?{target.query}" if target.query else "")
    headers = {}
    if user is not None:
        token = base64.b64encode(f"{user}:{password or ''}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    context = ssl.create_default_context(cafile=ca) if target.scheme == "https" else None

    class Proxy(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != page:  # the page alone: its auth opens nothing else through this proxy
                self.send_error(404)
                return
            request = urllib.request.Request(origin + page, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=30, context=context) as answer:
                    status, body, kind = answer.status, answer.read(MAX_BODY), answer.headers.get("Content-Type")
            except urllib.error.HTTPError as exc:
                status, body, kind = exc.code, exc.read(MAX_BODY), exc.headers.get("Content-Type")
            except (urllib.error.URLError, OSError) as exc:
                status, body, kind = 502, f"status_page_shot: {exc}".encode(), "text/plain"
            self.send_response(status)
            self.send_header("Content-Type", kind or "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}{page}"
    finally:
        server.shutdown()
        server.server_close()


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def chromium_command(url: str, profile: str, *action: str, size: tuple[int, int] = (1500, 900)) -> list[str]:
    """Headless Chromium doing `action` (--screenshot=..., --dump-dom) on `url`, its profile in a temp dir; the
    sandbox off only as root, where Chromium refuses to start with it."""
    command = [chromium() or "chromium", "--headless", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
               "--disable-extensions", "--disable-sync", "--mute-audio", f"--user-data-dir={profile}",
               f"--window-size={size[0]},{size[1]}", *action]
    if os.geteuid() == 0:
        command.append("--no-sandbox")
    return [*command, url]


def run_chromium(url: str, *action: str, size: tuple[int, int] = (1500, 900)) -> str:
    """Run headless Chromium on `url` (a loopback URL: the proxy's) and return what it printed on stdout."""
    with tempfile.TemporaryDirectory(prefix="sparkfleet-shot-") as profile:
        done = subprocess.run(chromium_command(url, profile, *action, size=size), capture_output=True, text=True,
                              timeout=TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"chromium exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return done.stdout


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG file; ValueError if it is none."""
    head = path.read_bytes()[:24]
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ValueError(f"{path} is not a PNG file")
    return struct.unpack(">II", head[16:24])


def screenshot(url: str, out: Path, user: str | None = None, password: str | None = None, ca: str | None = None,
               size: tuple[int, int] = (1500, 900)) -> tuple[int, int]:
    """The page at `url` as `out` (PNG), seen as the viewer `user`; returns the image's size."""
    out = out.resolve()
    out.unlink(missing_ok=True)
    with authorized(url, user, password, ca) as local:
        run_chromium(local, f"--screenshot={out}", size=size)
    return png_size(out)


def _size(text: str) -> tuple[int, int]:
    w, _, h = text.partition("x")
    if not (w.isdigit() and h.isdigit() and 100 <= int(w) <= 8000 and 100 <= int(h) <= 8000):
        raise argparse.ArgumentTypeError(f"{text!r}: give WIDTHxHEIGHT, each 100 to 8000")
    return int(w), int(h)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.status_page_shot", description=__doc__.split("\n")[0])
    parser.add_argument("url", help="the status page, e.g. http://door.lan:8080/status")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--user", help="a front_door_viewers name")
    parser.add_argument("--password-file", type=Path, help=f"the viewer's password (else ${PASSWORD_ENV})")
    parser.add_argument("--ca", help="a PEM file to trust for an https front door")
    parser.add_argument("--size", type=_size, default=(1500, 900), help="the window, WIDTHxHEIGHT (1500x900)")
    args = parser.parse_args(argv)
    if not chromium():
        print("status_page_shot: no chromium here (apt-get install chromium)", file=sys.stderr)
        return 2
    password = os.environ.get(PASSWORD_ENV)
    if args.password_file:
        password = args.password_file.read_text().strip()
    if args.user and password is None:
        print(f"status_page_shot: --user needs --password-file or ${PASSWORD_ENV}", file=sys.stderr)
        return 2
    try:
        width, height = screenshot(args.url, args.out, args.user, password, args.ca, args.size)
    except (RuntimeError, ValueError, OSError, subprocess.TimeoutExpired) as exc:
        print(f"status_page_shot: {exc}", file=sys.stderr)
        return 1
    print(f"{args.out}: {width}x{height}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
