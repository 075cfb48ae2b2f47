"""The API key goes only to the engine, on a converged simulated Spark (the engine in its nested docker):
the helpers find the engine container holding its port, and a squatter on a port never gets the key."""

import json
import shlex

from sparkfleet.contract import paths

from .conftest import ssh

SQUATTER = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

class H(BaseHTTPRequestHandler):
    def _answer(self):
        print(self.command, self.path, "AUTH" if self.headers.get("Authorization") else "-", flush=True)
        body = b'{"object": "list", "data": [{"id": "x"}]}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = _answer
    def log_message(self, *args):
        pass

HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_only_the_engine_container_gets_the_key(converged_fleet):
    host = "spark-1"
    watchdog = f"python3 {paths.BIN_DIR}/sparkfleet-watchdog --config {paths.SERVING_FILE}"
    probe = json.loads(ssh(converged_fleet, host, f"{watchdog} --probe"))
    assert (probe["serving"], probe["failed"]) == (True, None), probe  # the real check passed: nested cgroups
    config = json.loads(ssh(converged_fleet, host, f"cat {paths.SERVING_FILE}"))
    squat = ("d=$(mktemp -d); printf %s " + shlex.quote(SQUATTER) + " > $d/squat.py; "
             "python3 $d/squat.py 18999 > $d/log 2>&1 & pid=$!; sleep 1; "
             f"PYTHONPATH=\"$({paths.NEWEST_RUNTIME_COMMAND})\" python3 {paths.BIN_DIR}/sparkfleet-health "
             f"--serving {paths.SERVING_FILE} "
             f"--port 18999 --served-name x --timeout 10 --env-file {paths.ENGINE_ENV} "
             f"--container {shlex.quote(config['container'])} 2>&1; echo rc=$?; kill $pid; cat $d/log; rm -rf $d")
    out = ssh(converged_fleet, host, squat)
    assert "rc=1" in out and "health: the API key is not sent to 127.0.0.1:18999: port 18999 is held by process" in out
    assert "AUTH" not in out and "GET /health -" in out, out
