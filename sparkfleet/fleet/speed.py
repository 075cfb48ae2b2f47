"""A rollout's speed gate: the canary's new release must decode about as fast as its previous one.

The measurement is the bench module's (`run_bench`: one owner of "how fast"), one small fixed run that is the same
on every host (MEASURE: 4 requests at concurrency 1, then 4 at concurrency 4, 32 tokens each, thinking off). Kept:
the single-stream decode tokens/s (median over the concurrency-1 requests) and the TTFT (median at concurrency 1,
ms), in the host's speed record (contract/speed.py), keyed by release: the next rollout's baseline.

The regression rule (`regression`): decode lower, or TTFT higher, than the baseline by more than
`rollout_max_regression` (a share: 0.10 = 10 %) *and* by more than a noise floor (NOISE_DECODE_TOKENS_PER_S,
NOISE_TTFT_MS), so a busy controller's or host's jitter on a short run does not fail a healthy rollout.
"""

from __future__ import annotations

import datetime
import json
import socket
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass

from sparkfleet.contract import paths
from sparkfleet.contract.reach import api_url, ssh_command
from sparkfleet.contract.settings import Settings
from sparkfleet.contract.speed import Figures, parse_record, render_record
from sparkfleet.fleet.converge import host_said

MEASURE = {"concurrency": [1, 4], "max_tokens": 32, "requests_per_level": 4, "think": False, "timeout_s": 60.0}
NOISE_DECODE_TOKENS_PER_S = 1.0  # a drop below this is noise, whatever its share
NOISE_TTFT_MS = 50.0  # a rise below this is noise (one scheduling hiccup of a loaded host)
FORWARD_WAIT_S = 15.0  # how long an SSH forward may take to listen


class SpeedError(RuntimeError):
    """The engine could not be measured (no answer, errors in the run, no concurrency-1 figure)."""


class ReachError(SpeedError):
    """The controller could not reach the engine to measure it (the SSH forward failed): the engine is not to
    blame, so the gate says so and judges nothing."""


def figures_of(result: dict) -> Figures:
    """The kept figures of a bench result (run_bench's dict); SpeedError when the run had errors or no figure."""
    if result.get("errors"):
        messages = [m for level in result["levels"] for m in level["error_messages"]]
        raise SpeedError(f"{result['errors']} requests failed: {'; '.join(messages[:2])}")
    single = next((level for level in result["levels"] if level["concurrency"] == 1), None)
    decode = result.get("single_stream_decode_tokens_per_s")
    ttft = single["ttft_ms"]["p50"] if single else None
    if not decode or ttft is None:
        raise SpeedError("the run gave no single-stream decode rate or TTFT")
    at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return Figures(round(decode, 2), round(ttft, 1), at)


def _change(now: float, before: float) -> str:
    return f"{(now - before) / before * 100:+.0f} %"


def comparison(measured: Figures, baseline: Figures) -> str:
    """Both figures against the baseline's, for the report: "decode 30.1 tok/s vs 50.2 before (-40 %), TTFT ..."."""
    return (f"decode {measured.decode_tokens_per_s:.1f} tok/s vs {baseline.decode_tokens_per_s:.1f} before "
            f"({_change(measured.decode_tokens_per_s, baseline.decode_tokens_per_s)}), TTFT {measured.ttft_ms:.0f} ms "
            f"vs {baseline.ttft_ms:.0f} before ({_change(measured.ttft_ms, baseline.ttft_ms)})")


def regression(measured: Figures, baseline: Figures, max_regression: float) -> list[str]:
    """What regressed, one phrase each (none: it passes): decode down, or TTFT up, by more than `max_regression`
    of the baseline and more than the noise floor."""
    found = []
    drop = baseline.decode_tokens_per_s - measured.decode_tokens_per_s
    if drop > baseline.decode_tokens_per_s * max_regression and drop > NOISE_DECODE_TOKENS_PER_S:
        found.append(f"decode {measured.decode_tokens_per_s:.1f} tok/s vs {baseline.decode_tokens_per_s:.1f} before "
                     f"({_change(measured.decode_tokens_per_s, baseline.decode_tokens_per_s)})")
    rise = measured.ttft_ms - baseline.ttft_ms
    if rise > baseline.ttft_ms * max_regression and rise > NOISE_TTFT_MS:
        found.append(f"TTFT {measured.ttft_ms:.0f} ms vs {baseline.ttft_ms:.0f} before "
                     f"({_change(measured.ttft_ms, baseline.ttft_ms)})")
    return found


@dataclass
class SpeedCheck:
    """The speed gate's outcome on one host, as the report gives it."""

    host: str
    release: str | None  # the measured (new) release
    baseline_release: str | None
    verdict: str = "not measured"  # passed | regressed | baseline | failed | not measured
    measured: Figures | None = None
    baseline: Figures | None = None
    baseline_measured_now: bool = False  # the previous release had no figure: measured on the host before the switch
    seconds: float = 0.0  # the measurements' time (what the gate added)
    line: str = ""

    def judge(self, max_regression: float) -> None:
        """Set verdict and line from the figures (measured must be set)."""
        limit = f"rollout_max_regression {max_regression * 100:g} %"
        if self.baseline is None:
            self.verdict = "baseline"
            self.line = (f"{self.host}: decode {self.measured.decode_tokens_per_s:.1f} tok/s, TTFT "
                         f"{self.measured.ttft_ms:.0f} ms: no previous figure, this measurement is the baseline")
            return
        worse = regression(self.measured, self.baseline, max_regression)
        self.verdict = "regressed" if worse else "passed"
        self.line = (f"{self.host}: {', '.join(worse)}, over {limit}" if worse else
                     f"{self.host}: {comparison(self.measured, self.baseline)}: within {limit} or the noise floor "
                     f"({NOISE_DECODE_TOKENS_PER_S:g} tok/s, {NOISE_TTFT_MS:g} ms)")
        if self.baseline_measured_now:
            self.line += " (baseline measured now)"

    def to_dict(self) -> dict:
        figures = lambda f: None if f is None else {"decode_tokens_per_s": f.decode_tokens_per_s,  # noqa: E731
                                                    "ttft_ms": f.ttft_ms}
        return {"host": self.host, "verdict": self.verdict, "release": self.release, "measured": figures(self.measured),
                "baseline": None if self.baseline is None else {
                    **figures(self.baseline), "release": self.baseline_release,
                    "source": "measured now" if self.baseline_measured_now else "speed record"},
                "seconds": round(self.seconds, 1), "line": self.line}


def forward_command(name: str, data: dict, local_port: int, remote_port: int) -> list[str]:
    """OpenSSH's `ssh -N -L` from 127.0.0.1:local_port to the host's 127.0.0.1:remote_port, with the inventory's
    SSH settings (contract/reach.py `ssh_command`): an argument list, no shell."""
    return ssh_command(name, data, "-N", "-o", "BatchMode=yes", "-o", "ExitOnForwardFailure=yes",
                       "-L", f"127.0.0.1:{int(local_port)}:{paths.ENGINE_HOST}:{int(remote_port)}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def reach(name: str, s: Settings, data: dict):
    """The URL the controller measures a host's API at: status's (contract/reach.py `api_url`), or, where the API
    listens on loopback only, an SSH forward to it for the measurement's length. Where the guards may serve TLS
    only (a fleet CA, the key not sent in clear), an SSH forward to the engine itself on loopback: the engine's speed
    is what is measured, and the forward carries the key encrypted whatever the guard asks of a client."""
    if s.fleet_ca_cert and not s.backend_key_in_clear:
        with forwarded(name, data, paths.engine_port(s.api_port)) as url:
            yield url
        return
    url = api_url(name, s, data)
    if url is not None:
        yield url
        return
    with forwarded(name, data, s.api_port) as url:
        yield url


@contextmanager
def forwarded(name: str, data: dict, remote_port: int):
    """http://127.0.0.1:PORT of an SSH forward to the host's 127.0.0.1:remote_port, while the block runs;
    ReachError when it does not listen."""
    port = _free_port()
    tunnel = subprocess.Popen(forward_command(name, data, port, remote_port), stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + FORWARD_WAIT_S
        while True:
            if tunnel.poll() is not None:
                said = host_said(tunnel.stderr.read().decode(errors="replace").splitlines())  # a host's banner too
                raise ReachError(f"ssh forward to {name} failed: {' / '.join(said)}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise ReachError(f"ssh forward to {name}: no listener after {FORWARD_WAIT_S:g} s") from None
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        tunnel.terminate()
        tunnel.wait(10)


def measure(name: str, s: Settings, data: dict) -> Figures:
    """The fixed run (MEASURE) against the host's engine, as `s` serves it; SpeedError when it cannot be measured."""
    from sparkfleet.fleet.bench import BenchError, run_bench

    try:
        with reach(name, s, data) as url:
            result = run_bench(url, s.served_model_name, s.api_key, MEASURE["concurrency"], MEASURE["max_tokens"],
                               MEASURE["think"], MEASURE["requests_per_level"], timeout_s=MEASURE["timeout_s"])
    except (BenchError, OSError) as exc:
        raise SpeedError(str(exc)) from None
    return figures_of(result)


class SpeedGate:
    """What the rollout's canary step asks: a release's kept figure on a host, a measurement, keeping one.

    `hosts`: {name: (its planned settings, its inventory data)}; `records`: {name: its speed record as read back
    before the rollout (None or {} when it has none)}; `installed`: {name: the release record of what it runs}."""

    def __init__(self, inventory: str, hosts: dict[str, tuple[Settings, dict]], records: dict[str, dict | None],
                 installed: dict[str, dict | None] | None = None):
        self.inventory = inventory
        self.hosts = hosts
        self.kept = {name: parse_record(record) for name, record in records.items()}
        self.installed = installed or {}

    def max_regression(self, host: str) -> float:
        return self.hosts[host][0].rollout_max_regression

    def baseline(self, host: str, release: str | None) -> Figures | None:
        return self.kept.get(host, {}).get(release) if release else None

    def measure(self, host: str, running: bool = False) -> Figures:
        """The host's engine measured as the planned release serves it, or (`running`) as the release it runs now
        does (its record's served name and port)."""
        s, data = self.hosts[host]
        installed = (self.installed.get(host) or {}) if running else {}
        kinds = {"served_model_name": str, "api_port": int}  # read back from the host: typed before use
        s = s.model_copy(update={k: installed[k] for k, kind in kinds.items() if type(installed.get(k)) is kind})
        return measure(host, s, data)

    def keep(self, host: str, figures: dict[str, Figures]) -> bool:
        """Write the host's speed record with these releases' figures, in one SSH round trip; whether it was
        written (a failure is reported, never fatal: the next rollout then measures its baseline again)."""
        from sparkfleet.fleet.converge import wrote_state_file

        text = render_record(self.kept.get(host, {}), figures)
        ok = wrote_state_file(self.inventory, host, paths.SPEED_FILE, text)
        if ok:
            self.kept[host] = parse_record(json.loads(text))
        return ok
