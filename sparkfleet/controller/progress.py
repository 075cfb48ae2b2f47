"""Progress on long work while a deploy runs: each host's model fetch (files, bytes, rate, ETA) and its engine's
start (the engine's own phase lines), shown per host on stderr.

The stages decide, from what they already know, which hosts this run will fetch a model on or (re)start the
engine of (`watch`); only those are polled, so a no-op converge sends nothing more. The watcher is a pyinfra
state callback (pyinfra's own way to follow a run: the CLI's output is one too), so `pyinfra INVENTORY deploy.py`
and `sparkfleet rollout` show the same. Every ~2 s, while the host's operations run, it sends one small command
over that host's own SSH connection (paramiko gives each command a channel of its own): the fetch helper's
progress file (`paths.FETCH_PROGRESS`) and the engine unit's journal since the watch began, filtered to the
engines' phase lines (contract/engines.py `start_phases`). On a terminal the hosts are rich progress bars;
otherwise plain lines, one per host when its phase changes or every PLAIN_EVERY_S, so CI logs stay short. What a
host sends is data: its numbers are checked, its journal lines (printable ASCII, cut on the host) only pick one of
our phase labels and give two counts, and every line is printed literally (`tables.literal`); nothing secret is
read (paths and counts only).
"""

from __future__ import annotations

import atexit
import json
import re
import shlex
import sys
import time
from dataclasses import dataclass, field
from weakref import WeakKeyDictionary

from sparkfleet.contract import engines, paths
from sparkfleet.host.run import as_the_host_runs
from sparkfleet.tables import console, literal

POLL_S = 2.0  # between two reads of a host
POLL_TIMEOUT_S = 15  # one read's limit: a slow host skips a beat, it never holds the deploy
PLAIN_EVERY_S = 10.0  # not a terminal: a host's line at most this often, unless its phase changes
JOURNAL_LINES = 5  # the last phase lines read each time (the newest decides)
BAR_WIDTH = 20  # a terminal's bar, in columns
LINE_MAX = 300  # a journal line is cut here on the host (and again here before it is matched)
FETCH_STATES = ("checking", "fetching", "done", "failed")
NUMBER_MAX = 2**53  # a count, a size, a rate or a time a float holds exactly: a larger one is no fetch's
FILE_MAX = 4096  # the progress file is one small JSON object: a longer answer is no such file
UNREADABLE = "progress file unreadable"


# --- the engine's start, from its own lines (each engine's `start_phases`, contract/engines.py) and systemd's


PhaseLine = engines.StartPhase  # key (what the host's grep -F keeps), label, pattern (groups n, N), ready, failed

# The unit's journal holds one engine's lines: every engine's are looked for, the first that matches counts.
PHASE_LINES = (
    *engines.start_phases(),
    PhaseLine("Failed with result", "unit failed", failed=True),  # systemd: the unit's process exited
)


@dataclass(frozen=True)
class Phase:
    label: str
    done: int | None = None
    total: int | None = None
    ready: bool = False
    failed: bool = False

    def text(self) -> str:
        return f"{self.label} {self.done}/{self.total}" if self.total else self.label


def phase_of(line: str) -> Phase | None:
    """The phase one journal line says, or None. A tqdm line may hold several updates split by carriage returns:
    the last one counts."""
    line = line.rsplit("\r", 1)[-1][:LINE_MAX] if line.rstrip("\r") else ""
    for known in PHASE_LINES:
        if known.key not in line:
            continue
        found = re.search(known.pattern, line) if known.pattern else None
        if known.pattern and not found:
            continue
        counts = tuple(int(g) for g in found.groups()) if found and found.groups() else (None, None)
        if counts[1] is not None and not 0 <= counts[0] <= counts[1]:
            continue
        return Phase(known.label, *counts, ready=known.ready, failed=known.failed)
    return None


def engine_phase(lines: list[str]) -> Phase | None:
    """The newest phase among journal lines (oldest first)."""
    for line in reversed(lines):
        phase = phase_of(line)
        if phase:
            return phase
    return None


# --- the fetch, from the helper's progress file


@dataclass(frozen=True)
class Fetch:
    state: str
    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int
    rate_bps: int
    started_at: float
    updated_at: float


def _bounded(value, kinds=(int,)) -> bool:
    """A host's number that every line can print: of `kinds` (never a bool), finite, 0..NUMBER_MAX (NaN fails)."""
    return type(value) in kinds and 0 <= value <= NUMBER_MAX


def read_fetch(text: str) -> Fetch | None:
    """The progress file's content, checked (a host's answer: numbers only, 0..NUMBER_MAX, done <= total); None
    when it is absent or not one (10**400, NaN, a string, deep nesting: all None, never an exception)."""
    if len(text) > FILE_MAX:
        return None
    try:
        data = json.loads(text)
        values = {name: data[name] for name in ("files_done", "files_total", "bytes_done", "bytes_total", "rate_bps")}
        times = {name: data[name] for name in ("started_at", "updated_at")}
    except (ValueError, TypeError, KeyError, RecursionError):
        return None
    if data.get("state") not in FETCH_STATES or not all(map(_bounded, values.values())) \
            or not all(_bounded(v, (int, float)) for v in times.values()):
        return None
    if values["files_done"] > values["files_total"] or values["bytes_done"] > values["bytes_total"]:
        return None
    return Fetch(data["state"], **values, **{k: float(v) for k, v in times.items()})


_UNITS = ((10**12, "TB"), (10**9, "GB"), (10**6, "MB"), (10**3, "kB"))


def _scale(n: int) -> tuple[int, str]:
    return next(((size, unit) for size, unit in _UNITS if n >= size), (1, "B"))


def _number(n: float, size: int) -> str:
    return f"{n:.0f}" if size == 1 else f"{n / size:.1f}"


def amount(done: int, total: int) -> str:
    """'8.1 of 37.2 GB': both in the total's unit."""
    size, unit = _scale(total)
    return f"{_number(done, size)} of {_number(total, size)} {unit}"


def size_text(n: int) -> str:
    size, unit = _scale(n)
    return f"{_number(n, size)} {unit}"


def rate(bps: int) -> str:
    size, unit = _scale(bps)
    value = bps / size
    return f"{value:.0f} {unit}/s" if value >= 10 or size == 1 else f"{value:.1f} {unit}/s"


def duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 100:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    return f"{minutes} min {seconds:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def fetch_text(f: Fetch) -> str:
    """'fetch 12/40 files, 8.1 of 37.2 GB, 410 MB/s, ETA 71 s' (and its checking, done and failed forms)."""
    if f.state == "checking":
        return f"checking {f.files_done}/{f.files_total} files"
    if f.state == "done":
        return (f"fetched {f.files_total} files, {size_text(f.bytes_total)} "
                f"in {duration(max(0.0, f.updated_at - f.started_at))}")
    words = f"{f.files_done}/{f.files_total} files, {amount(f.bytes_done, f.bytes_total)}"
    if f.state == "failed":
        return f"fetch failed at {words}"
    if f.rate_bps:
        words += f", {rate(f.rate_bps)}, ETA {duration((f.bytes_total - f.bytes_done) / f.rate_bps)}"
    return f"fetch {words}"


# --- one host's view, and the command that reads it


@dataclass
class HostView:
    name: str
    fetch: Fetch | None = None
    phase: Phase | None = None
    finished: bool = False
    unreadable: bool = False  # the host's last answer was not one we read (a hostile progress file, say)

    def text(self) -> str:
        """What follows the host's name: the fetch while it runs (or failed), then the engine."""
        parts = [fetch_text(self.fetch)] if self.fetch and (self.fetch.state != "done" or not self.phase) else []
        if self.unreadable:
            parts.append(UNREADABLE)
        if self.phase:
            parts.append(f"engine {self.phase.text()}")
        return "; ".join(parts) or "waiting"

    def line(self) -> str:
        return f"{self.name}: {self.text()}"

    def key(self) -> tuple:
        """What counts as a change of phase (the plain lines' trigger): not each new byte or shard, but the first
        line that knows the fetch's rate (and so its ETA)."""
        fetch = self.fetch and (self.fetch.state, self.fetch.rate_bps > 0 and self.fetch.state == "fetching")
        return (fetch, self.phase and self.phase.label, self.finished, self.unreadable)


_MARK = "@@sparkfleet-progress"
# what a journal line keeps on its way here: printable ASCII, tabs, line ends and tqdm's carriage returns (vLLM's
# phase lines are ASCII; a bar's blocks, escape sequences or a multi-byte character cut in two are not)
_PRINTABLE = shlex.quote(r"\11\12\15\40-\176")


def poll_command(unit: str | None, since: int | None) -> str:
    """The host's clock, its fetch progress file and, for an engine `unit` once `since` (the host's clock when the
    watch began) is known, the unit's phase lines since then. Every value quoted."""
    # `|| true`: no progress file yet (a host just booted: /run is empty until its first fetch) is an answer too;
    # a failed cat failed the poll, and the watch began only once the fetch had written one, too late to count it
    parts = ["date +%s", f"echo {_MARK}", f"cat {shlex.quote(paths.FETCH_PROGRESS)} 2>/dev/null || true"]
    if unit and since is not None:
        keys = " ".join(f"-e {shlex.quote(key)}" for key in dict.fromkeys(p.key for p in PHASE_LINES))
        parts += [f"echo {_MARK}",
                  # --all: a line holding tqdm's carriage return is "unprintable" to journalctl, a blob without it
                  f"journalctl --no-pager --all -o cat -u {shlex.quote(unit)} --since @{int(since)} 2>/dev/null"
                  f" | grep -F {keys} | tail -n {JOURNAL_LINES} | LC_ALL=C tr -cd {_PRINTABLE} | cut -c1-{LINE_MAX}"]
    return "; ".join(parts)


def read_poll(stdout: str) -> tuple[int | None, str, list[str]]:
    """(the host's clock, the progress file's text, the journal's lines) of a poll_command's answer."""
    sections = stdout.split(_MARK)
    clock = sections[0].strip()
    now = int(clock) if clock.isdigit() else None
    text = sections[1].strip() if len(sections) > 1 else ""
    lines = [line for line in sections[2].split("\n") if line.strip()] if len(sections) > 2 else []  # keeps \r
    return now, text, lines


def update(view: HostView, since: int, text: str, lines: list[str], engine: bool) -> None:
    """A view after one answer: a progress file older than the watch (an earlier run's) is not this fetch; one that
    is there but not readable says so (the fetch shown stays the last one read)."""
    fetch = read_fetch(text)
    view.unreadable = fetch is None and bool(text)
    fetch = fetch if fetch and fetch.started_at >= since - 1 else view.fetch
    # the answer that first sees the fetch done shows it done: the engine's phases (read from the journal since
    # the watch began, so none is lost) wait for the next one
    just_fetched = fetch is not None and fetch.state == "done" and (view.fetch is None or view.fetch.state != "done")
    view.fetch = fetch
    if engine and not just_fetched:
        view.phase = engine_phase(lines) or view.phase
    fetched = view.fetch is not None and view.fetch.state in ("done", "failed")
    view.finished = view.finished or bool(view.phase and view.phase.ready) or (not engine and fetched)


def served(view: HostView, engine: bool) -> None:
    """The host's operations all succeeded, its health gate with them: its engine serves, whether or not vLLM's
    own "startup complete" line has reached the journal yet (journald writes a container's lines a moment
    later, and the gate may pass first)."""
    if engine and not (view.phase and view.phase.ready):
        view.phase = Phase("ready", ready=True)


@dataclass
class PlainLines:
    """Not a terminal: a host's line when its phase changes, else at most every PLAIN_EVERY_S."""

    last: dict[str, tuple[float, tuple]] = field(default_factory=dict)

    def due(self, view: HostView, now: float) -> bool:
        seen = self.last.get(view.name)
        if seen and seen[1] == view.key() and now - seen[0] < PLAIN_EVERY_S:
            return False
        self.last[view.name] = (now, view.key())
        return True


# --- the glue: a pyinfra state callback, registered by the stages


@dataclass
class _Watched:
    host: object  # pyinfra's Host
    unit: str | None  # the engine unit whose start is shown; None: a fetch only
    view: HostView
    since: int | None = None


class _Display:
    """rich's progress bars on a terminal, plain lines otherwise; both on stderr."""

    def __init__(self, live: bool):
        self.out = console(stderr=True)
        self.plain = None if live else PlainLines()
        self.bars = None
        self.tasks: dict[str, int] = {}

    def show(self, views: list[HostView]) -> None:
        if self.plain is not None:
            now = time.monotonic()
            for view in views:
                if (view.fetch or view.phase or view.unreadable) and self.plain.due(view, now):
                    self.out.print(literal(view.line()), highlight=False, soft_wrap=True)
            return
        from rich.progress import BarColumn, Progress, TextColumn

        if self.bars is None:
            self.width = max(len(v.name) for v in views)
            self.bars = Progress(TextColumn("{task.description}"), BarColumn(bar_width=BAR_WIDTH),
                                 TextColumn("{task.fields[detail]}"), console=self.out, auto_refresh=False,
                                 redirect_stdout=False)
            self.bars.start()
            atexit.register(self.close)  # a run that ends early (pyinfra's CLI exits) still gives the cursor back
        room = max(10, self.out.width - self.width - BAR_WIDTH - 3)  # the name and the bar whole, the rest cut
        for view in views:
            done, total = bar_of(view)
            text = view.text()
            text = text if len(text) <= room else text[:room - 1] + "\u2026"
            if view.name not in self.tasks:
                self.tasks[view.name] = self.bars.add_task(literal(view.name.ljust(self.width)), total=total,
                                                           detail="")
            self.bars.update(self.tasks[view.name], completed=done, total=total, detail=literal(text))
        self.bars.refresh()

    def close(self) -> None:
        if self.bars is not None:
            self.bars.stop()
            self.bars, self.tasks = None, {}


def bar_of(view: HostView) -> tuple[float, float | None]:
    """(completed, total) of a host's bar: the fetch's bytes, then the engine phase's n/N; no total (a pulse)
    for a phase without counts, full when ready."""
    if view.phase:
        if view.phase.ready:
            return 1, 1
        return (view.phase.done, view.phase.total) if view.phase.total else (0, None)
    if view.fetch and view.fetch.bytes_total:
        return view.fetch.bytes_done, view.fetch.bytes_total
    return 0, None


def _quietly(step, *args, **kwargs) -> None:
    """A pyinfra callback's work: the watch is a courtesy, so nothing it meets reaches the run (a callback that
    raises ends the run for every host)."""
    try:
        step(*args, **kwargs)
    except Exception:
        pass


def _make_watcher(state, live: bool):
    from pyinfra.api.state import BaseStateCallback

    class Watcher(BaseStateCallback):
        """Polls the watched hosts from the run's first operation until each one's last, or its failure."""

        def __init__(self):
            self.state = state
            self.watched: dict[str, _Watched] = {}  # those still polled
            self.registered: set[str] = set()
            self.display = _Display(live)
            self.greenlet = None
            self.closed = False

        def operation_host_start(self, state, host, op_hash):
            if self.greenlet is None and not self.closed:
                import gevent

                self.greenlet = gevent.spawn(self._loop, state)

        def operation_host_success(self, state, host, op_hash, retry_count=0):
            _quietly(self._maybe_last, state, host, op_hash, succeeded=True)

        def operation_host_error(self, state, host, op_hash, retry_count=0, max_retries=0):
            _quietly(self._maybe_last, state, host, op_hash)

        def host_disconnect(self, state, host):
            _quietly(self._drop, host.name)

        def _maybe_last(self, state, host, op_hash, succeeded=False):
            if host.op_hash_order and host.op_hash_order[-1] == op_hash:  # the host's own operations, in order
                self._drop(host.name, last_look=True, succeeded=succeeded and host not in state.failed_hosts)

        def _drop(self, name, last_look=False, succeeded=False):
            """The host's watch ends: its last line (after one more look when its operations are over, so that
            line is where it ended, not where the last poll left it)."""
            watched = self.watched.pop(name, None)
            if watched and not self.closed:
                if last_look and not watched.view.finished and watched.since is not None:
                    self._poll(self.state, watched)
                if succeeded:
                    served(watched.view, engine=watched.unit is not None)
                watched.view.finished = True
                self._show([watched.view])
            if not self.watched:
                self.close()

        def _show(self, views):
            try:
                self.display.show(views)
            except Exception:  # stderr gone (a closed pipe): the deploy goes on, unwatched
                self.closed = True

        def _poll(self, state, watched: _Watched) -> None:
            try:
                ok, output = as_the_host_runs(watched.host, poll_command(watched.unit, watched.since),
                                              timeout=POLL_TIMEOUT_S)
            except Exception:  # the watch is a courtesy: whatever it meets, the deploy goes on
                return
            try:
                now, text, lines = read_poll(output.stdout if ok else "")
                if watched.since is None:
                    watched.since = now
                    return
                update(watched.view, watched.since, text, lines, engine=watched.unit is not None)
            except Exception:  # the host's answer is data: one we cannot read is that host's line, not the run's end
                watched.view.unreadable = True

        def _loop(self, state) -> None:
            import gevent

            while not self.closed and self.watched:
                for name in [n for n, w in self.watched.items() if w.host in state.failed_hosts]:
                    self._drop(name)  # its operations stopped: no last one will come
                active = [w for w in self.watched.values() if not w.view.finished]
                gevent.joinall([gevent.spawn(self._poll, state, w) for w in active], timeout=POLL_TIMEOUT_S + 1)
                if self.closed:
                    break
                self._show([w.view for w in self.watched.values()])
                gevent.sleep(POLL_S)

        def close(self):
            """The display ends; the loop ends by itself (never killed inside a command on a shared connection)."""
            if not self.closed:
                self.closed = True
                try:
                    self.display.close()
                except Exception:
                    pass

    return Watcher()


_WATCHERS: WeakKeyDictionary = WeakKeyDictionary()


def watch(state, host, *, fetch: bool = False, engine: bool = False, unit: str = paths.UNIT_NAME) -> None:
    """The stages' hook: this run fetches a model on `host`, or (re)starts its engine unit (`unit`): show how it
    goes while the run executes. Neither: nothing is registered, nothing is polled."""
    if not (fetch or engine):
        return
    from pyinfra.context import ContextObject

    # pyinfra's `from pyinfra import state, host` are proxies of the current ones: the watcher keeps the objects
    state, host = (o._get_module() if isinstance(o, ContextObject) else o for o in (state, host))
    watcher = _WATCHERS.get(state)
    if watcher is None:
        watcher = _WATCHERS[state] = _make_watcher(state, live=sys.stderr.isatty())
        state.add_callback_handler(watcher)
    watcher.watched[host.name] = _Watched(host, unit if engine else None, HostView(host.name))
    watcher.registered.add(host.name)


def watched(state) -> list[str]:
    """The hosts this run watches (none on a no-op converge)."""
    watcher = _WATCHERS.get(state)
    return sorted(watcher.registered) if watcher else []


def close(state) -> None:
    """The run is over: the display ends (the fleet commands call it after pyinfra's run_ops)."""
    watcher = _WATCHERS.get(state)
    if watcher is not None:
        watcher.close()
