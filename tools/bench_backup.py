"""What a backup and a restore cost (issue 53), on the simulated fleet converged with inventory/sim_chat_ui.py.

    flock /tmp/sparkfleet-e2e.lock .venv/bin/python -m tools.bench_backup [INVENTORY] [--synthetic-mb 1024]

1. The office as the sim has it: `sparkfleet backup INVENTORY --json` (every source: seconds, bytes added), twice
   (the second is what an hourly run of an idle office sends), and the chat UI's latest snapshot restored into a
   scratch directory on its host (restic's part of `sparkfleet restore`; the UI keeps running).
2. A synthetic Open WebUI data directory of `--synthetic-mb` MB on the chat UI host, beside the real one: a
   webui.db of chats whose bodies are JSON of English-like words (text compresses as chats do), backed up by the
   host's own program (`sparkfleet_host backup run`) to a repository of its own on the target: the chat UI's env
   file with its data, staging, record and repository replaced. A first backup, a second after 1 % of the chats
   changed (an hour of an office's chatting: new chats appended, the newest updated), a third after the same share
   changed all over the file (the worst case for restic's chunks), then a restore of it. Each run as its unit runs it
   (systemd-run with the unit's idle CPU and I/O priority). Sizes: the data, what restic added, the
   repository on the target.
3. The cost while colleagues chat: `--clients` threads of plain chats through the door for `--quiet-s`, then while
   the synthetic first backup runs: completions a second and p50/p95 latency in each.

Everything it made on the hosts (the scratch data, the bench's repository) is removed at the end. Figures go in
docs/backups.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from sparkfleet.contract import backup as contract
from sparkfleet.contract.paths import HOST_MODULE
from sparkfleet.refused import Refused

ROOT = Path(__file__).resolve().parents[1]
SCRATCH = f"{contract.STATE}/bench"  # on the chat UI host
BENCH_REPO = "bench-synthetic"  # the bench's repository beside the sources' on the target
# what templates/sparkfleet-backup.service.j2 gives a run: colleagues' chats first
UNIT_PRIORITY = "-p Nice=19 -p CPUSchedulingPolicy=batch -p IOSchedulingClass=idle"
WORDS = ("the office model answers each colleague with tokens from a prompt cache while reasoning about tools "
         "and code review notes summaries of meetings drafts of letters tables numbers plans").split()


def sh(state: dict, host: str, command: str, timeout: float = 3600) -> str:
    """A command on a simulated host (docker exec), its output; a failure raises with its stderr."""
    from tools.soak import check_target

    proc = subprocess.run(["docker", "exec", check_target(host, state), "sh", "-c", command], capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode:
        raise Refused(f"{host}: {command[:80]}...: exit {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return proc.stdout


def synthetic_db_script(path: str, mb: int) -> str:
    """Python for the host: a webui.db of `mb` MB of chats (Open WebUI's chat table's shape, JSON bodies)."""
    return f"""
import json, random, sqlite3, os
os.makedirs(os.path.dirname({path!r}), exist_ok=True)
db = sqlite3.connect({path!r})
db.execute("CREATE TABLE IF NOT EXISTS chat (id TEXT PRIMARY KEY, user_id TEXT, title TEXT, chat TEXT, "
           "created_at INTEGER, updated_at INTEGER)")
rng, words = random.Random(53), {list(WORDS)!r}
target, n = {mb} * 1024 * 1024, 0
while os.path.getsize({path!r}) < target:
    rows = []
    for _ in range(500):
        body = " ".join(rng.choice(words) for _ in range(600))
        chat = {{"messages": [{{"role": "user", "content": body[:400]}}, {{"role": "assistant", "content": body}}]}}
        rows.append((f"c{{n}}", f"u{{n % 12}}", body[:40], json.dumps(chat), n, n))
        n += 1
    db.executemany("INSERT INTO chat VALUES (?, ?, ?, ?, ?, ?)", rows)
    db.commit()
print(n)
"""


def bench_env(env_text: str) -> str:
    """The chat UI's env file, pointed at the bench's data, staging, record and repository."""
    replaced = {"SPARKFLEET_BACKUP_DATA": f"{SCRATCH}/data", "SPARKFLEET_BACKUP_STAGING": f"{SCRATCH}/staging",
                "SPARKFLEET_BACKUP_RECORD": f"{SCRATCH}/last.json", "SPARKFLEET_BACKUP_TEXTFILE": f"{SCRATCH}/prom",
                "SPARKFLEET_BACKUP_STATE": SCRATCH}
    lines = []
    for line in env_text.splitlines():
        name = line.split("=", 1)[0]
        if name in replaced:
            line = f"{name}={shlex.quote(replaced[name])}"
        elif name == "RESTIC_REPOSITORY":
            line = line.replace(f"/{contract.CHAT_UI}", f"/{BENCH_REPO}")
        lines.append(line)
    return "\n".join(lines) + "\n"


def host_run(state: dict, host: str, env: str) -> dict:
    """One `backup run` of the host's program with the bench's env; its record."""
    started = time.monotonic()
    sh(state, host, f"systemd-run --quiet --wait --collect {UNIT_PRIORITY} python3 {HOST_MODULE} backup run "
                    f"--env {shlex.quote(env)}")
    took = time.monotonic() - started
    record = json.loads(sh(state, host, f"cat {SCRATCH}/last.json"))
    return {"seconds": round(took, 1), "bytes_added": record.get("bytes_added"), "files": record.get("files")}


def host_restore(state: dict, host: str, env: str, into: str) -> float:
    """restic's restore of the bench's latest snapshot into `into` on the host, with the env's repository."""
    code = (f"import sys; sys.path.insert(0, {str(Path(HOST_MODULE).parent)!r}); "
            f"from sparkfleet_host import backup as b; c = b.read_config({env!r}); "
            f"p = b.restic(c, 'restore', 'latest', '--target', {into!r}); sys.exit(p.returncode)")
    started = time.monotonic()
    sh(state, host, f"rm -rf {shlex.quote(into)} && python3 -c {shlex.quote(code)}")
    return round(time.monotonic() - started, 1)


def du(state: dict, host: str, path: str) -> int:
    return int(sh(state, host, f"du -sb {shlex.quote(path)} | cut -f1").strip() or 0)


def sparkfleet_backup(inventory: str) -> tuple[float, list[dict]]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "sparkfleet", "backup", inventory, "--json"], capture_output=True,
                          text=True, timeout=1800, cwd=ROOT)
    took = time.monotonic() - started
    if proc.returncode:
        raise Refused(f"sparkfleet backup failed: {proc.stderr.strip()[-800:]}")
    return round(took, 1), json.loads(proc.stdout)["backups"]


def latencies(done: list, start: float, end: float) -> dict:
    """Plain chats that started in [start, end): how many a second, their p50 and p95 latency, failures."""
    rows = [d for d in done if start <= d.start < end]
    ok = sorted(d.end - d.start for d in rows if d.outcome == "ok")
    q = statistics.quantiles(ok, n=20) if len(ok) >= 2 else [float("nan")] * 19
    return {"per_s": round(len(ok) / max(end - start, 1e-9), 2), "p50_s": round(statistics.median(ok), 3) if ok
            else None, "p95_s": round(q[18], 3), "failed": sum(1 for d in rows if d.outcome != "ok")}


def chat_load(inventory: str, seconds: float, clients: int, out: list) -> threading.Thread:
    """Colleagues chatting through the door (tools/bench_freeze.py's load) in a thread."""
    from sparkfleet.contract.settings import parse_settings
    from sparkfleet.controller.inventory import load_hosts
    from sparkfleet.contract.monitoring import FRONT_DOOR_GROUP
    from tools.bench_freeze import load

    hosts = load_hosts(inventory, FRONT_DOOR_GROUP)
    s = parse_settings(*hosts[0])
    user = next(iter(s.front_door_users.values()))
    key = user if isinstance(user, str) else user.key
    address = s.front_door_address.split("/")[0] if s.front_door_address else hosts[0][1]["lan_address"]
    url = f"http://{address}:{s.front_door_port}"
    thread = threading.Thread(target=load, args=(url, s.served_model_name, key, clients, 2, seconds, [0.0], out),
                              daemon=True)
    thread.start()
    return thread


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_backup", description=__doc__.split("\n\n")[0])
    parser.add_argument("inventory", nargs="?", default="inventory/sim_chat_ui.py")
    parser.add_argument("--synthetic-mb", type=int, default=1024)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--quiet-s", type=float, default=40)
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    from sim.fleet.fleet import load_state

    from sparkfleet.contract.paths import CHAT_UI_GROUP
    from sparkfleet.controller.inventory import load_hosts

    state = load_state()
    ui = load_hosts(args.inventory, CHAT_UI_GROUP)[0][0]
    target = load_hosts(args.inventory, contract.GROUP)[0][0]
    figures: dict = {"chat_ui_host": ui, "target": target}

    # 1. the office as the sim has it
    figures["sim_backup_s"], figures["sim_sources"] = sparkfleet_backup(args.inventory)
    figures["sim_again_s"], figures["sim_again_sources"] = sparkfleet_backup(args.inventory)
    figures["sim_data_bytes"] = du(state, ui, "/var/lib/sparkfleet/chat-ui/data")
    env = f"{SCRATCH}/restic.env"
    env_text = sh(state, ui, f"cat {contract.ENV}")
    subprocess.run(["docker", "exec", "-i", state_container(state, ui), "sh", "-c",
                    f"mkdir -p -m 0700 {SCRATCH} && umask 077 && cat > {env}"], input=bench_env(env_text),
                   text=True, check=True, timeout=30)
    chat_env = contract.ENV
    figures["sim_restore_s"] = host_restore(state, ui, chat_env, f"{SCRATCH}/restored-sim")
    try:
        # 2. a synthetic data directory of N MB
        started = time.monotonic()
        script = synthetic_db_script(f"{SCRATCH}/data/webui.db", args.synthetic_mb)
        rows = sh(state, ui, f"python3 -c {shlex.quote(script)}")
        figures["synthetic_made_s"] = round(time.monotonic() - started, 1)
        figures["synthetic_rows"] = int(rows.strip() or 0)
        figures["synthetic_bytes"] = du(state, ui, f"{SCRATCH}/data")
        # 3. its first backup while colleagues chat
        done: list = []
        t0 = time.monotonic()
        load = chat_load(args.inventory, args.quiet_s * 2 + 600, args.clients, done)
        time.sleep(args.quiet_s)
        b0 = time.monotonic()
        figures["synthetic_first"] = host_run(state, ui, env)
        b1 = time.monotonic()
        time.sleep(min(args.quiet_s, 20))
        figures["load_quiet"] = latencies(done, t0 + 5, b0)
        figures["load_during_backup"] = latencies(done, b0, b1)
        figures["load_after"] = latencies(done, b1, time.monotonic())
        load.join(0)
        sh(state, ui, f"python3 -c {shlex.quote(CHANGE_1PC.format(db=f'{SCRATCH}/data/webui.db'))}")
        figures["synthetic_an_hour_later"] = host_run(state, ui, env)
        sh(state, ui, f"python3 -c {shlex.quote(CHANGE_SCATTERED.format(db=f'{SCRATCH}/data/webui.db'))}")
        figures["synthetic_scattered_change"] = host_run(state, ui, env)
        figures["synthetic_restore_s"] = host_restore(state, ui, env, f"{SCRATCH}/restored")
        figures["synthetic_repository_bytes"] = du(state, target, f"{contract.TARGET_REPOS}/{BENCH_REPO}")
    finally:
        sh(state, ui, f"rm -rf {SCRATCH}")
        sh(state, target, f"rm -rf {contract.TARGET_REPOS}/{BENCH_REPO}")
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


# an hour of an office's chatting: 1 % more chats (appended, as Open WebUI inserts them) and the 100 newest updated
CHANGE_1PC = ("import sqlite3; db = sqlite3.connect('{db}'); "
              "n = db.execute('SELECT count(*) FROM chat').fetchone()[0]; "
              "rows = db.execute('SELECT title, chat FROM chat ORDER BY rowid DESC LIMIT ?', (n // 100,)).fetchall(); "
              "db.executemany('INSERT INTO chat VALUES (?, ?, ?, ?, ?, ?)', [(f'new{{i}}', 'u1', t, c, n + i, n + i) "
              "for i, (t, c) in enumerate(rows)]); "
              "db.execute(\"UPDATE chat SET chat = replace(chat, 'office', 'OFFICE') WHERE rowid > ? - 100\", (n,)); "
              "db.commit()")
# the same share changed all over the file (every 100th chat): SQLite's pages change everywhere, restic's chunks too
CHANGE_SCATTERED = ("import sqlite3; db = sqlite3.connect('{db}'); "
                    "db.execute(\"UPDATE chat SET chat = replace(chat, 'office', 'OFFICE') WHERE rowid % 100 = 0\"); "
                    "db.commit()")


def state_container(state: dict, host: str) -> str:
    from tools.soak import check_target

    return check_target(host, state)


if __name__ == "__main__":
    sys.exit(main())
