"""A fleet on loopback for the status page's tests: one exporter serving sample metrics of three Sparks (spark-2
drained on the front door and power-throttled, spark-3 failed), a front door and its users; and the real
Prometheus scraping it with the page's templates. Shared by the page's tests, the screenshot's and the docs'."""

from __future__ import annotations

import subprocess
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import requests
import yaml

from sparkfleet.contract import engines
from sparkfleet.contract import monitoring as m
from sparkfleet.roles import status_page
from tests.conftest import free_port
from tests.unit.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
CONSOLES = ROOT / "templates" / "consoles"  # the templates; Prometheus loads them filled in (status_page.render)
HOSTS = ("spark-1", "spark-2", "spark-3", "spark-4")
LLAMA = "spark-4"
ENGINES = {"spark-1": "sglang", LLAMA: "llamacpp"}  # the others run vLLM
DRAINED = "spark-2"
FAILED = "spark-3"  # its engine answers its scrape but not the watchdog's chat probe, nvidia-smi does not answer,
# and the watchdog gave up on it
DOOR = "door-1"
MODEL = "Qwen/Qwen3.5-35B-A3B-FP8"
HOSTILE = "<b onmouseover=alert(1)>x</b>"  # a label value a host made up: shown as text, never as markup
USERS = {"alice": 40, "bob": 12}  # requests per minute each makes in the samples


def _engine(host: str, t: float) -> str:
    """Each engine's own series (contract/engines.py): spark-1 runs SGLang, LLAMA llama.cpp (no KV gauge, no
    model label), the others vLLM."""
    kv = {DRAINED: 0.05, FAILED: 0.97}.get(host, 0.42)
    engine = ENGINES.get(host, "vllm")
    names = engines.metrics(engine)
    lbl = "" if engine == "llamacpp" else f'{{engine="0",model_name="{MODEL}"}}'
    return (f"{names.running}{lbl} {3 if host != DRAINED else 0}\n"
            f"{names.waiting}{lbl} {2 if engine == 'llamacpp' else 0}\n"
            + (f"{names.kv_usage}{lbl} {kv}\n" if names.kv_usage else "")
            + f"{names.generation_tokens}{lbl} {1000 + 55 * t:.0f}\n")


def _node(host: str, hostile: bool) -> str:
    if host == FAILED:
        return ("sparkfleet_gpu_reading_ok 0\n"
                'sparkfleet_watchdog_probe_ok{unit="sparkfleet-vllm.service"} 0\n'
                'sparkfleet_watchdog_gave_up{unit="sparkfleet-vllm.service"} 1\n'
                'sparkfleet_watchdog_restarts_total{unit="sparkfleet-vllm.service"} 3\n')
    throttled = host == DRAINED
    reasons = ["sw_power_cap", HOSTILE] if hostile else ["sw_power_cap"]
    return ("sparkfleet_gpu_reading_ok 1\n"
            f"sparkfleet_gpu_sm_clock_mhz {850 if throttled else 2418}\nsparkfleet_gpu_sm_clock_max_mhz 2418\n"
            f"sparkfleet_gpu_power_draw_watts {62 if throttled else 96}\n"
            f"sparkfleet_gpu_temperature_celsius {58 if throttled else 67}\n"
            + "".join(f'sparkfleet_gpu_throttle_active{{reason="{r}"}} {int(throttled)}\n' for r in reasons)
            + f'sparkfleet_gpu_throttle_active{{reason="gpu_idle"}} {int(not throttled)}\n'
            + 'sparkfleet_watchdog_probe_ok{unit="sparkfleet-vllm.service"} 1\n'
            'sparkfleet_watchdog_gave_up{unit="sparkfleet-vllm.service"} 0\n'
            'sparkfleet_watchdog_restarts_total{unit="sparkfleet-vllm.service"} 0\n'
            "node_memory_MemAvailable_bytes 9.1e10\nnode_memory_MemTotal_bytes 1.28e11\n")


def _front_door() -> str:
    lines = []
    for host in HOSTS:
        now = {DRAINED: "MAINT", FAILED: "DOWN"}.get(host, "UP")
        lines += [f'haproxy_server_status{{proxy="{m.FRONT_DOOR_PROXY}",server="{host}",state="{state}"}} '
                  f"{int(state == now)}" for state in ("DOWN", "UP", "MAINT", "DRAIN", "NOLB")]
    return "\n".join(lines) + "\n"


def _usage(t: float) -> str:
    lines = []
    for user, per_minute in USERS.items():
        n = per_minute * t / 60
        lines += [f'sparkfleet_user_requests_total{{user="{user}",model="{MODEL}"}} {n:.3f}',
                  f'sparkfleet_user_errors_total{{user="{user}",model="{MODEL}"}} 0',
                  f'sparkfleet_user_prompt_tokens_total{{user="{user}",model="{MODEL}"}} {n * 300:.0f}',
                  f'sparkfleet_user_completion_tokens_total{{user="{user}",model="{MODEL}"}} {n * 120:.0f}',
                  f'sparkfleet_user_limited_total{{user="{user}"}} {t if user == "bob" else 0:.3f}',
                  f'sparkfleet_user_in_flight{{user="{user}"}} {1 if user == "alice" else 0}']
    return "\n".join(lines) + "\n"


class _Exporter(BaseHTTPRequestHandler):
    started = time.time()
    hostile = True  # spark-2 also reports a throttle reason that is markup

    def do_GET(self):
        t = time.time() - self.started
        kind, _, host = self.path.strip("/").partition("/")
        body = {"engine": lambda: _engine(host, t), "node": lambda: _node(host, self.hostile),
                "front_door": _front_door, "usage": lambda: _usage(t)}.get(kind)
        if body is None:
            self.send_error(404)
            return
        data = body().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def scrape_config(exporter: str) -> dict:
    """One job per kind as the monitoring stage names them (contract/monitoring.py), each target labelled host."""
    def job(name: str, targets: list[tuple[str, str]]) -> dict:
        return {"job_name": name, "static_configs": [
            {"targets": [exporter], "labels": {m.HOST_LABEL: host, "__metrics_path__": path}}
            for host, path in targets]}

    return {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "scrape_configs": [
        job(m.JOB_ENGINE, [(h, f"/engine/{h}") for h in HOSTS]),
        job(m.JOB_NODE, [(h, f"/node/{h}") for h in HOSTS]),
        job(m.JOB_FRONT_DOOR, [(DOOR, "/front_door")]),
        job(m.JOB_USAGE, [(DOOR, "/usage")])]}


@contextmanager
def prometheus(tmp: Path, hostile: bool = True, scrape: bool = True, samples: int = 3):
    """The real Prometheus on loopback scraping the sample fleet (with a hostile label value, or without: the
    docs' screenshot; or nothing), the page's templates loaded; yields its URL once it holds `samples` samples of
    every target (one a second) for its rates. Its tests and fixtures need the prometheus tier (tests/tiers.py);
    the unit tests share one (tests/unit/conftest.py's sample_prometheus)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Exporter", (_Exporter,), {"hostile": hostile}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    libraries, consoles = tmp / "console_libraries", tmp / "consoles"
    libraries.mkdir()
    consoles.mkdir()
    for path, text in status_page.console_files().items():  # the page as the monitoring host gets it
        (consoles / Path(path).name).write_text(text)
    config = tmp / "prometheus.yml"
    exporter = f"127.0.0.1:{server.server_address[1]}"
    config.write_text(yaml.safe_dump(scrape_config(exporter) if scrape else {"global": {"scrape_interval": "1s"}}))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", f"--web.console.templates={consoles}",
                             f"--web.console.libraries={libraries}"],
                            stdout=subprocess.DEVNULL, stderr=(tmp / "prometheus.log").open("w"))
    try:
        wait_for(lambda: requests.get(f"{url}/-/ready", timeout=2).status_code == 200, 30)

        def enough() -> bool:
            q = requests.get(f"{url}/api/v1/query", params={"query": "count_over_time(up[1m])"}, timeout=2).json()
            counts = [float(r["value"][1]) for r in q["data"]["result"]]
            return len(counts) == 2 * len(HOSTS) + 2 and min(counts) >= samples

        if scrape:
            wait_for(enough, 30)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        server.shutdown()


def main(out: str) -> None:
    """docs/status-page.png: the sample fleet's page through the front door, shot with tools/status_page_shot.py."""
    import tempfile

    from tests.unit.test_front_door_status import CAROL, haproxy_door
    from tools import status_page_shot

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "p").mkdir()
        (Path(tmp) / "d").mkdir()
        with prometheus(Path(tmp) / "p", hostile=False, samples=8) as url, \
                haproxy_door(Path(tmp) / "d", int(url.rsplit(":", 1)[1])) as door:  # 8: smoother rates
            print(status_page_shot.screenshot(door + m.FRONT_DOOR_STATUS_PATH, Path(out), "carol", CAROL,
                                              size=(1600, 520)))


if __name__ == "__main__":
    import sys

    main(sys.argv[1])
