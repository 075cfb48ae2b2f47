"""The soak: steady traffic through the simulated fleet's front door while faults hit it, what each fault cost, and
proof afterwards that nothing was lost (issue 35).

    python -m tools.soak INVENTORY [--minutes N] [--short] [--json PATH] [--plot PATH]

INVENTORY is a simulated fleet's inventory with a front door (inventory/sim_front_door.py). Three users of the
soak's own (added with `sparkfleet users` to a secrets file in a private temporary directory, and a fourth,
throwaway one removed mid-run) send the seeds' client mix through the front door with the official `openai`
client at its default retries: streamed and plain chats, tool calls, embeddings where the door routes an
embedding model. Meanwhile a schedule of faults (FAULTS) hits the fleet: `--short` the four of SHORT_FAULTS in at
most 4 minutes, else every fault, one at a time and then two at once on different hosts. Only containers and
addresses of the simulated fleet's state file are ever targeted (`check_target`, `check_address`); every wait is
bounded in count and time.

It prints per fault when it was injected, noticed (by what), serving again, whether the soak had to put it right
itself, and the requests ok / failed while it lasted by kind; then the whole run against its quiet first minute,
the nothing-lost checks and the GOALS. Exit 1 when a goal fails (each failing goal named), 2 when the input is
refused. The pure parts live here, with their unit tests in tests/unit/test_soak.py; what touches the fleet is
tools/soak_fleet.py; the command that runs both, tools/soak/__main__.py.
"""

from __future__ import annotations

import ipaddress
import json
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from itertools import pairwise
from dataclasses import asdict, dataclass
from pathlib import Path

from sparkfleet.refused import Refused

KINDS = ("stream", "chat", "tool", "embedding")
OK = "ok"
MAX_FAULTS = 40  # the schedule's bound in count
SHORT_MINUTES = 4
FULL_MINUTES = 30
BASELINE_S = {"short": 10.0, "full": 60.0}  # the quiet start the run's latency is compared with
CLIENT_TIMEOUT_S = 30.0  # each request's own limit (the openai client's timeout), retries on top
STREAM_GRACE_S = 5.0  # a failed stream's end may come this long after the client's timeout and still count as ended


# --- the request log ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One request of the load: monotonic start and end, its kind, the user, and "ok" or its failure class."""

    start: float
    end: float
    kind: str
    user: str
    outcome: str

    @property
    def ok(self) -> bool:
        return self.outcome == OK

    @property
    def latency_s(self) -> float:
        return self.end - self.start


class RequestLog:
    """Requests as the load's threads finish them (a lock: many writers)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._done: list[Request] = []

    def add(self, request: Request) -> None:
        with self._lock:
            self._done.append(request)

    def snapshot(self) -> list[Request]:
        with self._lock:
            return list(self._done)


def in_window(requests: Iterable[Request], t0: float, t1: float) -> list[Request]:
    """The requests in flight at some moment of [t0, t1]: started before its end, ended after its start."""
    return [r for r in requests if r.start <= t1 and r.end >= t0]


def counts_by_kind(requests: Iterable[Request]) -> dict[str, dict[str, int]]:
    out = {kind: {"ok": 0, "failed": 0} for kind in KINDS}
    for r in requests:
        out[r.kind]["ok" if r.ok else "failed"] += 1
    return out


def failures_by_class(requests: Iterable[Request]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in requests:
        if not r.ok:
            out[r.outcome] = out.get(r.outcome, 0) + 1
    return dict(sorted(out.items()))


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank q-th percentile (None without values)."""
    if not values:
        return None
    ranked = sorted(values)
    rank = max(1, -(-len(ranked) * q // 100))  # ceil(n q / 100), at least the first
    return ranked[int(rank) - 1]


def latency_stats(requests: Sequence[Request]) -> dict:
    """Counts and p50/p99 latency of the answered requests (a failure's time says nothing of speed)."""
    answered = [r.latency_s for r in requests if r.ok]
    return {"requests": len(requests), "ok": len(answered), "failed": len(requests) - len(answered),
            "p50_s": percentile(answered, 50), "p99_s": percentile(answered, 99)}


# --- the load ----------------------------------------------------------------------------------------------------


class StreamBroken(Exception):
    """A stream that ended without its finish: the client saw an answer cut short."""


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def failure_class(exc: BaseException) -> str:
    """What a client saw: "http NNN", "timeout", "connection" or "stream broken" (openai's and httpx's errors)."""
    import openai

    try:  # the transport openai is built on (this pin's is httpx2), whose errors a stream raises mid-way
        import httpx2 as httpx
    except ImportError:  # pragma: no cover (an openai on plain httpx)
        import httpx

    if isinstance(exc, StreamBroken):
        return "stream broken"
    if isinstance(exc, openai.APIStatusError):
        return f"http {exc.status_code}"
    if isinstance(exc, (openai.APITimeoutError, httpx.TimeoutException)):
        return "timeout"
    if isinstance(exc, (openai.APIConnectionError, httpx.TransportError)):
        return "stream broken" if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)) else "connection"
    return type(exc).__name__


class Load:
    """`workers` threads, each sending the client mix in turn from the users in turn, until a deadline; each
    request is one `Request` in the log. The official client at its default retries (client_options change
    that: a unit test sets max_retries=0), one client per user."""

    def __init__(self, url: str, model: str, users: dict[str, str], log: RequestLog, *, workers: int = 4,
                 embedding_model: str | None = None, max_tokens: int = 16, client_timeout_s: float = CLIENT_TIMEOUT_S,
                 pause_s: float = 0.2, client_options: dict | None = None):
        from openai import OpenAI

        self.model, self.embedding_model, self.log = model, embedding_model, log
        self.max_tokens, self.pause_s, self.workers = max_tokens, pause_s, workers
        self.kinds = [k for k in KINDS if k != "embedding" or embedding_model]
        self.users = sorted(users)
        self.clients = {user: OpenAI(base_url=f"{url}/v1", api_key=key, timeout=client_timeout_s,
                                     **(client_options or {})) for user, key in users.items()}
        self.stop = threading.Event()

    def one(self, kind: str, user: str) -> Request:
        client, started = self.clients[user], time.monotonic()
        prompt = [{"role": "user", "content": f"soak {kind} from {user} at {started:.3f}"}]
        try:
            if kind == "embedding":
                client.embeddings.create(model=self.embedding_model, input=prompt[0]["content"])
            elif kind == "stream":
                finished = False
                for chunk in client.chat.completions.create(model=self.model, messages=prompt, stream=True,
                                                            max_tokens=self.max_tokens):
                    finished = finished or any(c.finish_reason for c in chunk.choices)
                if not finished:
                    raise StreamBroken("the stream ended without a finish reason")
            else:
                extra = {"tools": [WEATHER_TOOL], "tool_choice": "auto"} if kind == "tool" else {}
                client.chat.completions.create(model=self.model, messages=prompt, max_tokens=self.max_tokens, **extra)
            outcome = OK
        except Exception as exc:  # every failure is data: what the client saw
            outcome = failure_class(exc)
        done = Request(start=started, end=time.monotonic(), kind=kind, user=user, outcome=outcome)
        self.log.add(done)
        return done

    def _worker(self, n: int, deadline: float) -> None:
        turn = n
        while not self.stop.is_set() and time.monotonic() < deadline:
            self.one(self.kinds[turn % len(self.kinds)], self.users[turn % len(self.users)])
            turn += self.workers
            self.stop.wait(self.pause_s)

    def start(self, seconds: float) -> list[threading.Thread]:
        deadline = time.monotonic() + seconds
        threads = [threading.Thread(target=self._worker, args=(n, deadline), daemon=True, name=f"soak-load-{n}")
                   for n in range(self.workers)]
        for thread in threads:
            thread.start()
        return threads

    def run_for(self, seconds: float) -> None:
        """Send for `seconds`; back when every worker's last request ended (its own timeout bounds it)."""
        for thread in self.start(seconds):
            thread.join()


# --- the faults and their schedule -------------------------------------------------------------------------------


@dataclass(frozen=True)
class FaultSpec:
    """A fault as the schedule sees it: how long it usually lasts (placement), the most the soak waits for the
    host to serve again before it puts things right itself (the bound), whether it hits one host (the other
    hosts serve meanwhile) or the whole fleet (nothing else runs at once), and which goal judges its healing."""

    what: str
    typical_s: float
    max_s: float
    single_host: bool = True
    engine: bool = False  # judged by the watchdog's bound: heals alone within heal_bound_s
    overlap: bool = False  # taken again two at a time, on two hosts, in the full soak's second pass
    door: bool = False  # hits the door holding the floating address: run only where two doors share one


FAULTS: dict[str, FaultSpec] = {
    "engine-frozen": FaultSpec("docker pause vllm", 130, 240, engine=True, overlap=True),
    "frozen-after-restart": FaultSpec("the engine restarted, then docker pause vllm seconds after it answers",
                                      150, 270, engine=True, overlap=True),
    "engine-killed": FaultSpec("docker kill vllm", 30, 120, engine=True, overlap=True),
    "door-network-cut": FaultSpec("the network between the front door and the host cut both ways, 20 s",
                                  40, 90, overlap=True),
    "engine-hung": FaultSpec("the stand-in's generation-hang knob (health answers, chats wait)", 130, 240,
                             engine=True, overlap=True),
    "docker-restarted": FaultSpec("systemctl restart docker on the host", 60, 180, overlap=True),
    "host-rebooted": FaultSpec("the host rebooted", 90, 240),
    "host-powered-off": FaultSpec("the host powered off (its container stopped), back 60 s later", 120, 300),
    "shard-corrupted": FaultSpec("a verified shard's bytes changed on disk while the engine serves; a converge",
                                 120, 300),
    "model-root-full": FaultSpec("the model root too small for a new commit beside the old during a rollout",
                                 150, 420, single_host=False),
    "hub-registry-down": FaultSpec("the hub and the registry stopped during a rollout", 150, 420, single_host=False),
    "controller-killed": FaultSpec("the rollout's controller killed (SIGKILL) after its first drain, then a "
                                   "converge", 150, 420, single_host=False),
    "rollout": FaultSpec("sparkfleet rollout --batch 1 (a new max_model_len), then back", 180, 600,
                         single_host=False),
    "upgrade": FaultSpec("a newer driver published, sparkfleet upgrade --batch 1 (each Spark rebooted in turn), "
                         "then the old driver back", 240, 600, single_host=False),
    "door-lost": FaultSpec("the front door holding the floating address powered off (its container stopped at "
                           "once), back 60 s later", 90, 240, single_host=False, door=True),
}
# the order is the placement's: the long ones first, so the short soak packs in its 4 minutes
SHORT_FAULTS = ("engine-frozen", "frozen-after-restart", "engine-killed", "door-network-cut")
FULL_FAULTS = tuple(FAULTS)


@dataclass(frozen=True)
class Slot:
    """A fault planned at `at_s` seconds into the run on `host` (None: the whole fleet); `overlaps`: another
    fault planned to run at the same time, if any."""

    at_s: float
    fault: str
    host: str | None
    overlaps: str | None = None


def _busy(slots: list[Slot], t0: float, t1: float) -> list[Slot]:
    return [s for s in slots if s.at_s < t1 and s.at_s + FAULTS[s.fault].typical_s > t0]


def _place(slots: list[Slot], name: str, hosts: Sequence[str], t: float, cap: int) -> Slot | None:
    """`name` at `t` on a host free then, if at most `cap` hosts are faulted at once and no fleet-wide fault
    runs; None when it does not fit there."""
    spec = FAULTS[name]
    busy = _busy(slots, t, t + spec.typical_s)
    if any(s.host is None for s in busy) or (busy and not spec.single_host) or len(busy) >= cap:
        return None
    taken = {s.host for s in busy}
    host = next((h for h in hosts if h not in taken), None)
    if host is None:
        return None
    return Slot(t, name, host if spec.single_host else None, busy[0].fault if busy else None)


def plan_schedule(names: Sequence[str], hosts: Sequence[str], run_s: float, baseline_s: float,
                  alone_first: bool | None = None) -> list[Slot]:
    """The faults' times and hosts. The short soak (`alone_first` False) packs its faults as early as they fit,
    at most every host but one faulted at once; the full soak (True, the default for more than the short
    faults) runs each fault alone first, then the `overlap` faults again two at a time on two hosts while the
    run has time. Refused when the faults do not fit `run_s` or a name is unknown."""
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        raise Refused(f"unknown fault {unknown[0]!r}: the faults are {', '.join(FAULTS)}")
    if not hosts:
        raise Refused("no host to put faults on: the inventory's Sparks are the targets")
    if alone_first is None:
        alone_first = set(names) != set(SHORT_FAULTS)
    slots: list[Slot] = []
    end = baseline_s
    if alone_first:
        for n, name in enumerate(names):
            spec = FAULTS[name]
            slots.append(Slot(end, name, hosts[n % len(hosts)] if spec.single_host else None))
            end += spec.typical_s
    else:
        cap = max(1, len(hosts) - 1)
        for name in names:
            starts = sorted({baseline_s, *(s.at_s + FAULTS[s.fault].typical_s for s in slots)})
            placed = next((p for t in starts if (p := _place(slots, name, hosts, t, cap))), None)
            if placed is None or placed.at_s + FAULTS[name].typical_s > run_s:
                needed = max((s.at_s + FAULTS[s.fault].typical_s for s in slots), default=baseline_s)
                raise Refused(f"the faults need more than {run_s / 60:g} minutes ({name} does not fit after "
                              f"{needed:.0f} s): give --minutes more, or fewer faults")
            slots.append(placed)
        slots = [Slot(s.at_s, s.fault, s.host, next((o.fault for o in _busy(slots, s.at_s, s.at_s +
                      FAULTS[s.fault].typical_s) if o is not s), None)) for s in slots]
        end = max(s.at_s + FAULTS[s.fault].typical_s for s in slots)
    if end > run_s:
        raise Refused(f"the faults need {end / 60:.1f} minutes one at a time, more than --minutes "
                      f"{run_s / 60:g}: give --minutes {int(-(-end // 60))} or more")
    if alone_first and len(hosts) >= 2:
        pairs = [n for n in names if FAULTS[n].overlap]
        for a, b in zip(pairs[::2], pairs[1::2], strict=False):  # an odd one out stays alone
            length = max(FAULTS[a].typical_s, FAULTS[b].typical_s)
            if end + length > run_s or len(slots) + 2 > MAX_FAULTS:
                break
            slots += [Slot(end, a, hosts[0], b), Slot(end, b, hosts[1], a)]
            end += length
    check_schedule(slots, run_s, typical=True)
    return slots


def check_schedule(slots: Sequence[Slot], run_s: float, typical: bool = False) -> None:
    """The schedule's bounds: at most MAX_FAULTS, each ending (at its bound, or its typical length for a
    plan) by `run_s`, two at once never on the same host. Refused otherwise."""
    if len(slots) > MAX_FAULTS:
        raise Refused(f"{len(slots)} faults: a soak runs at most {MAX_FAULTS}")
    for s in slots:
        spec = FAULTS[s.fault]
        length = spec.typical_s if typical else spec.max_s
        if s.at_s + length > run_s:
            raise Refused(f"{s.fault} at {s.at_s:.0f} s runs past the end of the soak ({run_s:.0f} s): "
                          "give --minutes more")
        for other in slots:
            if other is not s and other.host is not None and other.host == s.host and \
                    other.at_s < s.at_s + length and s.at_s < other.at_s + FAULTS[other.fault].typical_s:
                raise Refused(f"{s.fault} and {other.fault} at once on the same host {s.host}: put them on two")


def removal_at_s(slots: Sequence[Slot], run_s: float, baseline_s: float) -> float:
    """When the throwaway user is removed (a converge of the front door, mid-run): half way, unless a fleet-wide
    fault (a rollout, which drives the door too) runs then: a quarter into the quiet baseline instead, so that the
    door's reload (seconds after, at the converge's end) is its own event. At the baseline's end it met the first
    fault: an engine frozen as the door reloaded, whose requests held by the old process waited for the client's
    timeout (HAProxy's old process checks no more)."""
    half = run_s / 2
    if any(s.host is None and s.at_s <= half < s.at_s + FAULTS[s.fault].typical_s for s in slots):
        return baseline_s / 4
    return half


# --- what may be targeted ----------------------------------------------------------------------------------------


def fleet_containers(state: dict) -> dict[str, str]:
    """{host name: its container} of the simulated fleet's state file, the services container by its own name."""
    rows = [*state.get("hosts", []), *state.get("service_hosts", [])]
    out = {row["name"]: row["container"] for row in rows}
    services = (state.get("services") or {}).get("container")
    if services:
        out[services] = services
    return out


def check_target(name: str, state: dict) -> str:
    """The container a fault may touch: a host of the simulated fleet (by name or container) or its services
    container, as the state file lists them; anything else refused."""
    known = fleet_containers(state)
    if name in known:
        return known[name]
    if name in known.values():
        return name
    raise Refused(f"{name!r} is not a container of the simulated fleet ({', '.join(sorted(known.values()))}): "
                  "the soak touches nothing else")


def check_address(address: str, addresses: dict[str, str]) -> str:
    """An address a network fault may cut: one that a fleet container holds ({container: address}, read from
    Docker for checked containers), nothing else."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        ip = None
    if ip is None or str(ip) not in addresses.values():
        raise Refused(f"{address!r} is not an address of the simulated fleet: the soak cuts nothing else")
    return str(ip)


# --- what happened and the goals ---------------------------------------------------------------------------------


@dataclass
class FaultResult:
    """One fault as it went (monotonic times; None: did not happen). `command`: the soak had to put it right
    itself (unpause, power on early, converge) because the fleet did not by the fault's bound."""

    fault: str
    host: str | None
    injected: float | None
    noticed: float | None = None
    noticed_by: str | None = None
    serving_again: float | None = None
    command: bool = False
    overlaps: str | None = None
    note: str = ""

    @property
    def until(self) -> float | None:
        return self.serving_again


DOOR_TAKEOVER_S = 5.0  # issue 37: new requests served by the other door this soon after the holder is lost
# issue 54: a non-streaming request started after a freeze or a hang waits at most this: the door marks the engine
# down in ~3.5 s (two missed 1 s checks) and ends what it held, the door or the client sends it elsewhere
STALL_BOUND_S = 10.0
STALL_FAULTS = ("engine-frozen", "frozen-after-restart", "engine-hung")
# issue 54: after a lone freeze or hang, no window of DIP_WINDOW_S within DIP_AFTER_S completes fewer than half the
# quiet rate (the baseline's completions per window): the door moves the load to the other engines, not a pause
DIP_WINDOW_S = 5.0
DIP_AFTER_S = 30.0
GOALS = {
    "non-streaming": "non-streaming requests: 0 failed in every fault where another host serves the model",
    "streaming": "streams fail only when in flight at the fault, each ended with an error before the client's timeout",
    "engine heals alone": "a frozen, hung or killed engine serves again within the watchdog's bound, no command",
    "powered-off host back": "a host powered off and back serves again with no command",
    "door lost": f"the door holding the address lost: the other serves within {DOOR_TAKEOVER_S:g} s, failures at "
                 "most the requests in flight",
    "nothing lost": "after the storm: 0 changes on a converge, every nothing-lost check passes",
    "no stall": f"a frozen or hung engine: no non-streaming request started after the fault waits more than "
                f"{STALL_BOUND_S:g} s",
    "no dip": f"a lone frozen or hung engine: no {DIP_WINDOW_S:g}-s window in the {DIP_AFTER_S:g} s after it "
              "completes fewer than half the quiet rate",
}


@dataclass(frozen=True)
class Goal:
    name: str
    ok: bool
    detail: str


def heal_bound_s(interval_s: float, failures: int, start_s: float) -> float:
    """watchdog_interval_s x (watchdog_failures + 1), plus the engine's start."""
    return interval_s * (failures + 1) + start_s


def _window_end(result: FaultResult, requests: Sequence[Request]) -> float:
    if result.serving_again is not None:
        return result.serving_again
    return max((r.end for r in requests), default=result.injected or 0.0)


def _at_once(result: FaultResult, results: Sequence[FaultResult], requests: Sequence[Request]) -> set[str]:
    """The hosts faulted while `result` lasted (itself included); "*" for a fleet-wide fault."""
    t0, t1 = result.injected, _window_end(result, requests)
    hosts = set()
    for other in results:
        if other.injected is None or other.injected > t1 or _window_end(other, requests) < t0:
            continue
        hosts.add(other.host or "*")
    return hosts


def completions(requests: Sequence[Request], t0: float, windows: int) -> list[int]:
    """The requests of every kind completed well (by their end) in each of `windows` windows of DIP_WINDOW_S from
    t0."""
    counts = [0] * max(windows, 0)
    for q in requests:
        i = int((q.end - t0) // DIP_WINDOW_S)
        if q.ok and q.end >= t0 and i < len(counts):
            counts[i] += 1
    return counts


def quiet_rate(requests: Sequence[Request], started: float, baseline_s: float) -> float | None:
    """Completions per DIP_WINDOW_S over the quiet baseline; None where it is shorter than one window."""
    windows = int(baseline_s // DIP_WINDOW_S)
    return sum(completions(requests, started, windows)) / windows if windows else None


def windows_after(result: FaultResult, requests: Sequence[Request]) -> list[int]:
    """The completions in each window of DIP_AFTER_S after the fault, as many as the load ran whole."""
    last = max((q.end for q in requests), default=result.injected)
    return completions(requests, result.injected, int(min(DIP_AFTER_S, last - result.injected) // DIP_WINDOW_S))


def evaluate_goals(results: Sequence[FaultResult], requests: Sequence[Request], *, serving_hosts: int,
                   heal_bound_s: float, client_timeout_s: float, checks: dict[str, list[str]],
                   converge_changes: int | None, quiet: float | None = None) -> list[Goal]:
    """Each goal of GOALS, judged on what happened; `quiet`: the baseline's completions per DIP_WINDOW_S (None:
    too short a baseline, no dip judged)."""
    ran = [r for r in results if r.injected is not None]
    windows = [(r, in_window(requests, r.injected, _window_end(r, requests))) for r in ran]

    bad_plain = []
    for r, during in windows:
        at_once = _at_once(r, ran, requests)
        if FAULTS[r.fault].single_host and "*" not in at_once and serving_hosts - len(at_once) >= 1:
            failed = [q for q in during if q.kind != "stream" and not q.ok]
            if failed:
                bad_plain.append(f"{r.fault} on {r.host}: {len(failed)} failed "
                                 f"({', '.join(f'{k} {n}' for k, n in failures_by_class(failed).items())})")

    bad_streams = []
    for q in (q for q in requests if q.kind == "stream" and not q.ok):
        if q.latency_s > client_timeout_s + STREAM_GRACE_S:
            bad_streams.append(f"a stream at {q.start:.0f} ran {q.latency_s:.0f} s, past the client's timeout")
            continue
        # in flight on a sick host: started before the fault, or after it but before the door noticed it (the
        # door still routed to it); a stream that fails once the door knows is sparkfleet's to answer for
        hit = [r for r, during in windows if q in during
               and q.start <= (r.noticed if r.noticed is not None else _window_end(r, requests))]
        if not hit:
            bad_streams.append(f"a stream started at {q.start:.0f} failed ({q.outcome}) after every fault in "
                               "flight was noticed")

    bad_heals = []
    for r in ran:
        if not FAULTS[r.fault].engine:
            continue
        if r.serving_again is None:
            bad_heals.append(f"{r.fault} on {r.host}: never served again")
        elif r.command:
            bad_heals.append(f"{r.fault} on {r.host}: needed a command (the soak put it right)")
        elif r.serving_again - r.injected > heal_bound_s:
            bad_heals.append(f"{r.fault} on {r.host}: served again after {r.serving_again - r.injected:.0f} s, "
                             f"bound {heal_bound_s:.0f} s")

    bad_power = [f"{r.fault} on {r.host}: " + ("never served again" if r.serving_again is None else
                                               "needed a command")
                 for r in ran if r.fault == "host-powered-off" and (r.serving_again is None or r.command)]

    bad_doors = []
    for r, during in windows:
        if not FAULTS[r.fault].door:
            continue
        in_flight = [q for q in requests if q.start < r.injected < q.end]
        failed = [q for q in during if not q.ok]
        # the first request of the load sent after the loss and served; where every thread of the load still waits
        # on a connection to the lost door (no reset ever comes from a powered-off host: the client's timeout ends
        # it), the soak's own probe through the address (`serving_again`) is the request sent after it
        served = [q.end for q in during if q.ok and q.start >= r.injected] or \
            ([r.serving_again] if r.serving_again is not None else [])
        if len(failed) > len(in_flight):
            bad_doors.append(f"{r.fault} ({r.host}): {len(failed)} failed, {len(in_flight)} in flight at the loss")
        if not served or min(served) - r.injected > DOOR_TAKEOVER_S:
            bad_doors.append(f"{r.fault} ({r.host}): " + (f"the first request sent after it was served "
                                                           f"{min(served) - r.injected:.1f} s later" if served else
                                                           "no request sent after it was served"))

    stalls = []
    for r, during in windows:
        if r.fault not in STALL_FAULTS:
            continue
        late = [q for q in during if q.kind != "stream" and q.start >= r.injected and q.latency_s > STALL_BOUND_S]
        if late:
            worst = max(late, key=lambda q: q.latency_s)
            stalls.append(f"{r.fault} on {r.host}: {len(late)} started after it waited over {STALL_BOUND_S:g} s "
                          f"(the longest {worst.latency_s:.1f} s, {worst.start - r.injected:.1f} s after it)")

    dips = []
    for r in ran:
        if quiet is None or r.fault not in STALL_FAULTS or _at_once(r, ran, requests) != {r.host}:
            continue  # two engines out at once halve an office of three by themselves: not the door's to bound
        low = [(i, n) for i, n in enumerate(windows_after(r, requests)) if n < quiet / 2]
        if low:
            i, n = min(low, key=lambda w: w[1])
            dips.append(f"{r.fault} on {r.host}: {n} completed {i * DIP_WINDOW_S:g}-{(i + 1) * DIP_WINDOW_S:g} s "
                        f"after it, under half the quiet {quiet:.1f}")

    lost = [p for problems in checks.values() for p in problems]
    if converge_changes is None:
        lost.insert(0, "the converge afterwards did not report")
    elif converge_changes:
        lost.insert(0, f"the converge afterwards changed {converge_changes} operations")

    def goal(name: str, problems: list[str]) -> Goal:
        return Goal(name, not problems, "; ".join(problems[:5]) + (f" (+{len(problems) - 5})" if len(problems) > 5
                                                                   else "") if problems else "met")

    return [goal("non-streaming", bad_plain), goal("streaming", bad_streams), goal("engine heals alone", bad_heals),
            goal("powered-off host back", bad_power), goal("door lost", bad_doors), goal("nothing lost", lost),
            goal("no stall", stalls), goal("no dip", dips)]


# --- the nothing-lost checks -------------------------------------------------------------------------------------


def key_problems(statuses: dict[str, int], removed: set[str]) -> list[str]:
    """Every kept user's key answers 200, a removed one 401."""
    out = []
    for user, status in sorted(statuses.items()):
        want = 401 if user in removed else 200
        if status != want:
            out.append(f"{user} answered {status}, want {want}" + (" (removed)" if user in removed else ""))
    return out


def usage_problems(samples: Sequence[tuple[float, dict[str, int]]], resets: Sequence[float] = ()) -> list[str]:
    """Per-user request counters (what `sparkfleet usage` sums over the doors) never fall: not across a reload,
    a restart or the loss of a door either (the doors keep them on disk), except across `resets` the caller names."""
    out = []
    ordered = sorted(samples, key=lambda s: s[0])
    for (t0, before), (t1, after) in pairwise(ordered):
        if any(t0 < r <= t1 for r in resets):
            continue
        for user in sorted(before):
            if user in after and after[user] < before[user]:
                out.append(f"{user}'s requests fell from {before[user]} to {after[user]} between {t0:g} s and {t1:g} s")
    return out


def record_problems(before: dict[str, dict], after: dict[str, dict], rolled: set[str]) -> list[str]:
    """Each host's release record as before. On the `rolled` hosts (a rollout went through them and the soak put it
    back) the same release serves again; what the record keeps for a rollback (`previous`) is the rollout's."""
    out = []
    for host in sorted(before):
        if host not in after:
            out.append(f"{host}'s release record is gone")
        elif host in rolled:
            if after[host].get("release_id") != before[host].get("release_id"):
                out.append(f"{host} serves release {after[host].get('release_id')}, not "
                           f"{before[host].get('release_id')} (every rollout was put back)")
        elif after[host] != before[host]:
            out.append(f"{host}'s release record changed")
    return out


def lock_problems(before: bytes | None, after: bytes | None, rolled: bool) -> list[str]:
    return [] if before == after or rolled else ["the release lock changed"]


def converge_changes(pyinfra_json: str) -> dict[str, list[str]]:
    """{host: operations that changed something or failed} of `pyinfra --json`'s results (as tests/e2e read it)."""
    try:
        operations = json.loads(pyinfra_json)["results"]["operations"]
    except (ValueError, KeyError, TypeError):
        raise ValueError("pyinfra printed no results") from None
    out: dict[str, list[str]] = {}
    for op in operations:
        for host in op.get("success", []):
            out.setdefault(host, []).append(op["name"])
        for host in op.get("error", []):
            out.setdefault(host, []).append(f"{op['name']} (failed)")
    return out


def secret_problems(journals: dict[str, str], secrets: dict[str, str]) -> list[str]:
    """Which host's journal holds which secret, by the secret's name: never its value."""
    return [f"{host}'s journal holds {name}'s key" if name != "api_key" else f"{host}'s journal holds the api_key"
            for host, text in sorted(journals.items()) for name, value in sorted(secrets.items())
            if value and value in text]


def rehash_script(model_dirs: Sequence[str]) -> str:
    """Python for a host: every file of each model directory re-hashed against its verified record, with the
    host package's own rule (sparkfleet_host/verify.py file_matches); prints {dir: {files, bad, record}}. The
    directories are data (a JSON literal), never code."""
    from sparkfleet.contract import paths

    return (f"import json, sys\nsys.path.insert(0, {json.dumps(paths.BIN_DIR)})\n"
            "from sparkfleet_host import verify as h\n"
            f"dirs = json.loads({json.dumps(json.dumps(list(model_dirs)))})\n"
            "out = {}\n"
            "for d in dirs:\n"
            "    record = h.read_record(d)\n"
            "    bad = []\n"
            "    for path, entry in sorted(record.items()):\n"
            "        if not isinstance(entry, dict) or 'hash' not in entry:\n"
            "            continue\n"
            "        pinned = {'size': entry['size'], ('sha256' if len(entry['hash']) == 64 else 'blob_sha1'): "
            "entry['hash']}\n"
            "        try:\n"
            "            ok = h.file_matches(d + '/' + path, pinned)\n"
            "        except OSError:\n"
            "            ok = False\n"
            "        if not ok:\n"
            "            bad.append(path)\n"
            "    out[d] = {'files': len(record), 'bad': bad, 'record': bool(record)}\n"
            "print(json.dumps(out))\n")


def verified_problems(host: str, answer: str) -> list[str]:
    try:
        found = json.loads(answer)
    except ValueError:
        return [f"{host}: the re-hash answered no JSON"]
    out = []
    for model_dir, row in sorted(found.items()):
        if not row.get("record"):
            out.append(f"{host}: {model_dir} has no verified record")
        out += [f"{host}: {model_dir}/{path} no longer matches its verified record" for path in row.get("bad", [])]
    return out


# --- the report --------------------------------------------------------------------------------------------------


def _rel(t: float | None, started: float) -> float | None:
    return None if t is None else round(t - started, 1)


def build_report(requests: Sequence[Request], results: Sequence[FaultResult], *, started: float, baseline_s: float,
                 heal_bound: float, serving_hosts: int, client_timeout_s: float, checks: dict[str, list[str]],
                 converge_changes: int | None, notes: Sequence[str] = ()) -> dict:
    """The whole run as plain data (the JSON, the table and the plot are made from it); times in seconds from
    the start of the load."""
    faults = []
    for r in results:
        end = _window_end(r, requests) if r.injected is not None else None
        during = in_window(requests, r.injected, end) if r.injected is not None else []
        faults.append({"fault": r.fault, "host": r.host, "what": FAULTS[r.fault].what, "overlaps": r.overlaps,
                       "injected_s": _rel(r.injected, started), "noticed_s": _rel(r.noticed, started),
                       "noticed_by": r.noticed_by, "serving_again_s": _rel(r.serving_again, started),
                       "command": r.command, "note": r.note, "requests": counts_by_kind(during),
                       "failures": failures_by_class(during),
                       **({"windows_after": windows_after(r, requests)} if r.fault in STALL_FAULTS and
                          r.injected is not None else {})})
    baseline = [r for r in requests if r.start < started + baseline_s]
    quiet = quiet_rate(requests, started, baseline_s)
    goals = evaluate_goals(results, requests, serving_hosts=serving_hosts, heal_bound_s=heal_bound,
                           client_timeout_s=client_timeout_s, checks=checks, converge_changes=converge_changes,
                           quiet=quiet)
    return {"baseline_s": baseline_s, "heal_bound_s": heal_bound, "serving_hosts": serving_hosts,
            "quiet_per_window": quiet,
            "baseline": latency_stats(baseline), "run": {**latency_stats(requests),
                                                         "by_kind": counts_by_kind(requests),
                                                         "failures": failures_by_class(requests)},
            "faults": faults, "checks": {name: problems for name, problems in checks.items()},
            "converge_changes": converge_changes, "notes": list(notes),
            "goals": [asdict(g) for g in goals],
            "timeline": [[round(r.start - started, 2), round(r.end - started, 2), r.kind, r.ok] for r in requests]}


def _s(value) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _ms(value) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


def print_report(report: dict, file=None) -> None:
    """The Rich tables: per fault, the whole run against its baseline, the checks, the goals."""
    from rich.console import Console

    from sparkfleet.tables import CI_WIDTH, literal, table

    out = Console(file=file or sys.stdout, width=CI_WIDTH, emoji=False, highlight=False)
    rows = []
    for f in report["faults"]:
        req = f["requests"]
        plain = {k: sum(req[k][s] for s in ("ok",)) for k in req}
        failed = sum(req[k]["failed"] for k in req if k != "stream")
        rows.append((literal(f["fault"]), literal(f["host"] or "fleet"), _s(f["injected_s"]),
                     f"{_s(f['noticed_s'])} ({literal(f['noticed_by'] or '-')})", _s(f["serving_again_s"]),
                     "[red]yes[/]" if f["command"] else "no", str(sum(plain.values())),
                     f"[red]{failed}[/]" if failed else "0",
                     f"{req['stream']['ok']} / " + (f"[red]{req['stream']['failed']}[/]" if req["stream"]["failed"]
                                                    else "0"),
                     literal(f["overlaps"] or "")))
    out.print(table("faults (seconds from the start of the load)",
                    ("fault", "host", "injected", "noticed (by)", "serving again", "command", "ok",
                     "failed (not streams)", "streams ok / failed", "overlapping"), rows))
    base, run = report["baseline"], report["run"]
    out.print(table("the run", ("", "requests", "ok", "failed", "p50", "p99"), [
        (f"baseline (first {report['baseline_s']:g} s)", str(base["requests"]), str(base["ok"]), str(base["failed"]),
         _ms(base["p50_s"]), _ms(base["p99_s"])),
        ("whole run", str(run["requests"]), str(run["ok"]), str(run["failed"]), _ms(run["p50_s"]),
         _ms(run["p99_s"]))]))
    checks = [(literal(name), "[green]ok[/]" if not problems else "[red]" + literal("; ".join(problems[:3])) + "[/]")
              for name, problems in report["checks"].items()]
    changes = report["converge_changes"]
    checks.append(("converge afterwards", "[red]did not report[/]" if changes is None else
                   f"{changes} changes" if not changes else f"[red]{changes} changes[/]"))
    out.print(table("nothing lost", ("check", "result"), checks))
    out.print(table("goals", ("goal", "", "detail"), [
        (literal(GOALS[g["name"]]), "[green]met[/]" if g["ok"] else "[red]FAIL[/]", literal(g["detail"]))
        for g in report["goals"]]))
    for note in report.get("notes", ()):
        out.print(literal(note))


def plot_report(report: dict, path: str | Path, bucket_s: float = 5.0) -> None:
    """Requests a bucket over time, answered and failed, with each fault's span shaded and named."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timeline = report["timeline"]
    end = max((row[1] for row in timeline), default=bucket_s)
    buckets = int(end // bucket_s) + 1
    ok, failed = [0] * buckets, [0] * buckets
    for start, _, _, good in timeline:
        (ok if good else failed)[int(max(0.0, start) // bucket_s)] += 1
    xs = [n * bucket_s for n in range(buckets)]
    fig, ax = plt.subplots(figsize=(12, 4.5))
    ax.plot(xs, ok, label="answered", color="tab:green")
    ax.plot(xs, failed, label="failed", color="tab:red")
    for n, f in enumerate(report["faults"]):
        if f["injected_s"] is None:
            continue
        until = f["serving_again_s"] if f["serving_again_s"] is not None else end
        ax.axvspan(f["injected_s"], until, alpha=0.15, color=f"C{n % 10}")
        ax.text(f["injected_s"], max(ok + failed + [1]) * (0.95 - 0.05 * (n % 6)), f["fault"], fontsize=7)
    ax.set_xlabel("seconds from the start of the load")
    ax.set_ylabel(f"requests started per {bucket_s:g} s")
    ax.set_title("soak: requests through the front door, faults shaded")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def failed_goals(report: dict) -> list[str]:
    return [g["name"] for g in report["goals"] if not g["ok"]]
