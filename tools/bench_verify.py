"""How fast does sparkfleet-fetch verify model files, against this machine's SHA-256 limit?

    python tools/bench_verify.py [--dir DIR] [--shards N] [--shard-mib M] [--workers W] [--repeat R]
                                           [--openssl-seconds S] [--json]

On one set of generated files (page-cached before any timing), it measures:

- the verifier: files/sparkfleet-fetch's own ``hash_all`` (its ``file_hash`` on W threads), best of R passes;
- the single-core SHA-256 limit: ``openssl speed -evp sha256`` and hashlib over an in-memory buffer,
  plus hashlib on every lane at once (what the cores deliver together, without file I/O);
- ``sha256sum`` file by file, for reference;
- the ratios verifier / (lanes x single-core OpenSSL rate), lanes = min(cores, shards, workers),
  target >= 0.8, and verifier / sha256sum;
- the cached re-verify: ``sparkfleet.host.model_files.files_needing_work`` on a synthesized manifest shaped
  like Qwen3.5-35B-A3B-FP8, and the fetch script's own re-verify when its record vouches for every
  file (rehashed must be 0, and /proc/self/io shows what was read).

This is a benchmark, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.machinery
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sparkfleet import FILES_DIR
from sparkfleet.host.model_files import files_needing_work
from sparkfleet.contract.shared import verify
from sparkfleet.model.manifest import Manifest, ManifestFile

FETCH_SCRIPT = FILES_DIR / "sparkfleet-fetch"
BENCH_LIST = ".sparkfleet-bench.json"  # what was generated into --dir, so a re-run can reuse it
MIB, GIB = 1 << 20, 1 << 30
CHUNK = 8 * MIB

_fetch_module = None


def load_fetch(path: Path = FETCH_SCRIPT):
    """files/sparkfleet-fetch as a module (its main() is guarded, so loading runs nothing)."""
    global _fetch_module
    if _fetch_module is None or Path(_fetch_module.__file__) != Path(path):
        loader = importlib.machinery.SourceFileLoader("sparkfleet_fetch", str(path))
        spec = importlib.util.spec_from_loader(loader.name, loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        _fetch_module = module
    return _fetch_module


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def gib_s(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / GIB if seconds > 0 else float("inf")


# --- the files ---------------------------------------------------------------------------------

def _write_shard(path: Path, size: int) -> dict:
    """size bytes of unique, incompressible data, hashed as written.

    os.urandom runs at ~0.1-0.2 GiB/s here, too slow for gigabytes, so each file gets its own
    urandom block and every chunk is that block rotated by a fresh offset: unique bytes at memory
    speed (SHA-256's speed does not depend on the content anyway).
    """
    block = os.urandom(CHUNK)
    digest = hashlib.sha256()
    written, k = 0, 0
    with open(path, "wb") as f:
        while written < size:
            offset = (k * 1_000_003 + 4099) % CHUNK
            chunk = (block[offset:] + block[:offset])[: size - written]
            f.write(chunk)
            digest.update(chunk)
            written += len(chunk)
            k += 1
    return {"path": path.name, "size": size, "sha256": digest.hexdigest()}


def generate_files(directory: Path, shards: int, shard_bytes: int, workers: int) -> list[dict]:
    """shards safetensors-named files of shard_bytes each in directory; their manifest entries.

    A directory that already holds exactly this set (listed in BENCH_LIST) is reused as is.
    """
    directory.mkdir(parents=True, exist_ok=True)
    listing = directory / BENCH_LIST
    names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    try:
        entries = json.loads(listing.read_text())
        if ([e["path"] for e in entries] == names and all(e["size"] == shard_bytes for e in entries)
                and all((directory / n).stat().st_size == shard_bytes for n in names)):
            return entries
    except (OSError, ValueError, KeyError, TypeError):
        pass
    with ThreadPoolExecutor(max(1, workers)) as pool:
        entries = list(pool.map(lambda n: _write_shard(directory / n, shard_bytes), names))
    listing.write_text(json.dumps(entries, indent=1))
    return entries


def warm_page_cache(paths: list[Path]) -> tuple[int, float]:
    """Read every file once so the timed passes hash from memory, not disk."""
    buf = bytearray(CHUNK)
    total, start = 0, time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return total, time.perf_counter() - start


# --- the measurements --------------------------------------------------------------------------

def time_verifier(fetch, directory: Path, entries: list[dict], workers: int, repeat: int = 1) -> dict:
    """Full verify through the fetch script's own parallel hashing (best of repeat passes)."""
    items = [(directory / e["path"], e) for e in entries]
    passes, results = [], []
    for _ in range(max(1, repeat)):
        start = time.perf_counter()
        results = fetch.hash_all(items, workers)
        passes.append(time.perf_counter() - start)
    seconds = min(passes)
    nbytes = sum(e["size"] for e in entries)
    return {"seconds": seconds, "bytes": nbytes, "gib_s": gib_s(nbytes, seconds), "all_ok": all(results),
            "passes_gib_s": [gib_s(nbytes, t) for t in passes], "results": results}


OPENSSL_LINE = re.compile(r"^\s*(\S+)\s+([0-9.]+)k\s*$")


def parse_openssl_speed(output: str) -> float | None:
    """Bytes per second from `openssl speed -evp sha256 -bytes N` output (its figures are 1000s of B/s)."""
    for line in reversed(output.splitlines()):
        m = OPENSSL_LINE.match(line)
        if m and "sha" in m.group(1).lower():
            return float(m.group(2)) * 1000
    return None


def openssl_rate(seconds: int = 3) -> dict:
    """Single-core SHA-256 rate from `openssl speed`; a reason instead when it cannot be had."""
    openssl = shutil.which("openssl")
    if not openssl:
        return {"bytes_s": None, "note": "openssl not installed"}
    cmd = [openssl, "speed", "-evp", "sha256", "-bytes", "16384", "-seconds", str(seconds)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"bytes_s": None, "note": f"openssl speed failed: {exc}"}
    rate = parse_openssl_speed(proc.stdout)
    if proc.returncode != 0 or rate is None:
        return {"bytes_s": None, "note": f"openssl speed gave no figure (exit {proc.returncode})"}
    return {"bytes_s": rate, "gib_s": rate / GIB, "note": " ".join(cmd[1:])}


def hashlib_rate(total: int = 256 * MIB, chunk: int = CHUNK) -> dict:
    """Single-core hashlib.sha256 over an in-memory buffer, chunk bytes per update."""
    buf = memoryview(bytearray(os.urandom(chunk)) * (total // chunk))
    digest = hashlib.sha256()
    start = time.perf_counter()
    for off in range(0, len(buf), chunk):
        digest.update(buf[off:off + chunk])
    seconds = time.perf_counter() - start
    return {"bytes": len(buf), "seconds": seconds, "gib_s": gib_s(len(buf), seconds)}


def hashlib_parallel_rate(threads: int, per_thread: int = 256 * MIB, chunk: int = CHUNK) -> dict:
    """hashlib.sha256 over an in-memory buffer on `threads` threads at once: what this machine's
    cores really deliver together (a VM's vCPUs may not scale linearly), with no file I/O."""
    buf = memoryview(bytearray(os.urandom(chunk)) * (per_thread // chunk))

    def one(_):
        digest = hashlib.sha256()
        for off in range(0, len(buf), chunk):
            digest.update(buf[off:off + chunk])

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(threads)))
    seconds = time.perf_counter() - start
    nbytes = threads * len(buf)
    return {"threads": threads, "bytes": nbytes, "seconds": seconds, "gib_s": gib_s(nbytes, seconds)}


def sha256sum_rate(directory: Path, entries: list[dict]) -> dict:
    """`sha256sum` file by file (one process at a time), checked against the manifest."""
    tool = shutil.which("sha256sum")
    if not tool:
        return {"gib_s": None, "note": "sha256sum not installed"}
    nbytes, ok = 0, True
    start = time.perf_counter()
    for e in entries:
        out = subprocess.run([tool, str(directory / e["path"])], capture_output=True, text=True, check=True).stdout
        ok &= out.split()[0] == e["sha256"]
        nbytes += e["size"]
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "bytes": nbytes, "gib_s": gib_s(nbytes, seconds), "all_ok": ok}


def synthetic_model(shards: int = 14, shard_size: int = 2_700_000_000, small: int = 10):
    """A manifest shaped like Qwen3.5-35B-A3B-FP8, with the record and the stat dict
    (as the ModelFiles fact reports it) of a host where every file is verified."""
    files, record, stats = [], {}, {}
    for i in range(shards):
        path = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        files.append(ManifestFile(path, shard_size + i, sha256=hashlib.sha256(path.encode()).hexdigest()))
    smalls = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json",
              "merges.txt", "model.safetensors.index.json", "chat_template.jinja", "preprocessor_config.json",
              "README.md", "LICENSE", "configuration.json"]
    for i, path in enumerate((smalls * (small // len(smalls) + 1))[:small]):
        path = path if i < len(smalls) else f"extra/{i}-{path}"
        files.append(ManifestFile(path, 1000 + 37 * i, blob_sha1=hashlib.sha1(path.encode()).hexdigest()))
    manifest = Manifest("modelscope", "Qwen/Qwen3.5-35B-A3B-FP8", "master", "0" * 40, tuple(files))
    for n, f in enumerate(manifest.files):
        stat = {"size": f.size, "mtime_ns": 1_767_000_000_000_000_000 + n * 1_000_003, "ino": 1_048_576 + n}
        stats[f.path] = stat
        record[f.path] = {**stat, "hash": f.sha256 or f.blob_sha1}
    return manifest, record, stats


def time_files_needing_work(manifest, record, stats, calls: int = 2000, rounds: int = 5) -> dict:
    """Per-call time of the controller's decision (best of rounds)."""
    needed = files_needing_work(manifest, record, stats)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            files_needing_work(manifest, record, stats)
        best = min(best, (time.perf_counter() - start) / calls)
    return {"seconds": best, "needed": needed, "files": len(manifest.files), "bytes": manifest.total_bytes}


def proc_io() -> dict:
    try:
        return {k: int(v) for k, v in (line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())}
    except OSError:
        return {}


def write_record(fetch, directory: Path, entries: list[dict], results: list[bool] | None = None) -> None:
    """The verified record the fetch script writes after hashing: path -> stat_key + hash."""
    results = results if results is not None else [True] * len(entries)
    verify.write_record(directory, {e["path"]: verify.record_entry(os.stat(directory / e["path"]), e)
                                         for e, ok in zip(entries, results, strict=True) if ok})


def reverify_with_record(fetch, directory: Path, entries: list[dict], workers: int, full_verify: bool = False,
                         subprocess_too: bool = True) -> dict:
    """Run the fetch script's main() on a directory whose record vouches for every file.

    In-process first (so /proc/self/io shows the bytes it read), then as the process a host
    runs. Nothing is downloaded: every file is present.
    """
    with tempfile.TemporaryDirectory(prefix="sparkfleet-bench-job-") as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({
            "manifest": {"hub": "modelscope", "repo": "bench/synthetic", "revision": "master", "commit": None,
                         "files": entries},
            "model_dir": str(directory), "staging_dir": str(Path(tmp) / "staging"), "endpoint": None}))
        argv = [str(FETCH_SCRIPT), str(job), "--env-file", str(Path(tmp) / "no.env"), "--workers", str(workers)]
        argv += ["--full-verify"] if full_verify else []
        out, saved = io.StringIO(), sys.argv
        before = proc_io()
        start = time.perf_counter()
        try:
            sys.argv = argv
            with contextlib.redirect_stdout(out):
                rc = fetch.main()
        finally:
            sys.argv = saved
        seconds = time.perf_counter() - start
        after = proc_io()
        report = json.loads(out.getvalue().splitlines()[-1]) if rc == 0 else {}
        result = {"seconds": seconds, "rc": rc, "rehashed": report.get("rehashed"), "fetched": report.get("fetched"),
                  "rchar": after.get("rchar", 0) - before.get("rchar", 0) if before else None,
                  "read_bytes": after.get("read_bytes", 0) - before.get("read_bytes", 0) if before else None,
                  "file_bytes": sum(e["size"] for e in entries)}
        if subprocess_too:
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=600)
            result["process_seconds"] = time.perf_counter() - start
            result["process_rehashed"] = (json.loads(proc.stdout.splitlines()[-1])["rehashed"]
                                          if proc.returncode == 0 else None)
        return result


# --- the run -----------------------------------------------------------------------------------

def run(directory: Path, shards: int, shard_bytes: int, workers: int, openssl_seconds: int = 3,
        hashlib_bytes: int = 256 * MIB, repeat: int = 3) -> dict:
    fetch = load_fetch()
    cores = usable_cores()
    t0 = time.perf_counter()
    entries = generate_files(directory, shards, shard_bytes, cores)
    generate_s = time.perf_counter() - t0
    (directory / verify.RECORD_NAME).unlink(missing_ok=True)
    warm_bytes, warm_s = warm_page_cache([directory / e["path"] for e in entries])

    verifier = time_verifier(fetch, directory, entries, workers, repeat)
    if not verifier["all_ok"]:
        raise SystemExit(f"benchmark: the verifier rejected generated files in {directory}; remove them and re-run")
    write_record(fetch, directory, entries, verifier.pop("results"))
    ssl = openssl_rate(openssl_seconds)
    hl = hashlib_rate(hashlib_bytes)
    lanes = max(1, min(cores, shards, workers))
    hl_par = hashlib_parallel_rate(lanes, hashlib_bytes)
    s256 = sha256sum_rate(directory, entries)
    fnw = time_files_needing_work(*synthetic_model())
    reverify = reverify_with_record(fetch, directory, entries, workers)

    ratio_ssl = verifier["gib_s"] / (lanes * ssl["gib_s"]) if ssl.get("bytes_s") else None
    return {
        "dir": str(directory), "cores": cores, "workers": workers, "shards": shards, "shard_bytes": shard_bytes,
        "lanes": lanes, "generate_seconds": generate_s, "page_cache_warm": {"bytes": warm_bytes, "seconds": warm_s,
                                                                          "gib_s": gib_s(warm_bytes, warm_s)},
        "verifier": verifier,
        "openssl_single_core": ssl,
        "hashlib_single_core": hl,
        "hashlib_parallel_in_memory": hl_par,
        "sha256sum": s256,
        "ratio_verifier_vs_openssl_limit": ratio_ssl,
        "ratio_target": 0.8,
        "meets_target": None if ratio_ssl is None else ratio_ssl >= 0.8,
        "ratio_verifier_vs_hashlib_limit": verifier["gib_s"] / (lanes * hl["gib_s"]),
        "ratio_verifier_vs_parallel_in_memory": verifier["gib_s"] / hl_par["gib_s"],
        "ratio_verifier_vs_sha256sum": verifier["gib_s"] / s256["gib_s"] if s256.get("gib_s") else None,
        "files_needing_work": fnw,
        "reverify_with_record": reverify,
    }


def _fmt(value, unit="GiB/s", digits=2):
    return "n/a" if value is None else f"{value:.{digits}f} {unit}".strip()


def print_table(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    v, ssl, hl, s256 = r["verifier"], r["openssl_single_core"], r["hashlib_single_core"], r["sha256sum"]
    fnw, rv = r["files_needing_work"], r["reverify_with_record"]
    table = Table(title=f"sparkfleet-fetch verify: {r['shards']} x {r['shard_bytes'] // MIB} MiB, "
                        f"{r['workers']} workers, {r['cores']} cores, page-cached")
    table.add_column("measure")
    table.add_column("figure", justify="right")
    table.add_column("note")
    table.add_row("verifier (fetch hash_all)", _fmt(v["gib_s"]),
                  f"{v['bytes'] / GIB:.2f} GiB in {v['seconds']:.2f} s, best of "
                  + ", ".join(f"{x:.2f}" for x in v["passes_gib_s"]))
    table.add_row("openssl sha256, 1 core", _fmt(ssl.get("gib_s")), ssl["note"])
    table.add_row("hashlib sha256, 1 core", _fmt(hl["gib_s"]), f"{hl['bytes'] // MIB} MiB in-memory, 8 MiB updates")
    table.add_row(f"hashlib sha256, {r['lanes']} threads", _fmt(r["hashlib_parallel_in_memory"]["gib_s"]),
                  "in-memory, all lanes at once: the cores' real joint limit, no file I/O")
    table.add_row("sha256sum, file by file", _fmt(s256.get("gib_s")), s256.get("note", "one process at a time"))
    table.add_row(f"verifier / ({r['lanes']} x openssl)", _fmt(r["ratio_verifier_vs_openssl_limit"], ""),
                  "target >= 0.8" + ("" if r["meets_target"] is None
                                     else (": met" if r["meets_target"] else ": NOT met")))
    table.add_row(f"verifier / ({r['lanes']} x hashlib)", _fmt(r["ratio_verifier_vs_hashlib_limit"], ""), "")
    table.add_row(f"verifier / hashlib {r['lanes']} threads", _fmt(r["ratio_verifier_vs_parallel_in_memory"], ""),
                  "cost of reading files, beyond the machine's own scaling")
    table.add_row("verifier / sha256sum", _fmt(r["ratio_verifier_vs_sha256sum"], ""), "")
    table.add_row("files_needing_work, cached", _fmt(fnw["seconds"] * 1e6, "µs", 1),
                  f"{fnw['files']} files, {fnw['bytes'] / 1e9:.1f} GB synthesized; needed={len(fnw['needed'])}")
    table.add_row("fetch re-verify, record vouches", _fmt(rv["seconds"] * 1e3, "ms", 1),
                  f"rehashed={rv['rehashed']}, read {rv['rchar']} B of {rv['file_bytes']} B (rchar), "
                  f"disk read_bytes={rv['read_bytes']}")
    if "process_seconds" in rv:
        table.add_row("  same, as a process", _fmt(rv["process_seconds"] * 1e3, "ms", 1),
                      f"rehashed={rv['process_rehashed']} (includes interpreter start)")
    console = Console()
    console.width = max(console.width, 130)
    console.print(table)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/bench_verify.py", description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, help="generate (and keep, and reuse) the files here; default a temp dir")
    parser.add_argument("--shards", type=int, default=2 * usable_cores(), help="files to generate (default 2 x cores)")
    parser.add_argument("--shard-mib", type=int, default=512, help="size of each file in MiB (default 512)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="verifier threads (default cpus)")
    parser.add_argument("--repeat", type=int, default=3, help="verifier passes, best reported (default 3)")
    parser.add_argument("--openssl-seconds", type=int, default=3, help="length of `openssl speed` (default 3)")
    parser.add_argument("--json", action="store_true", help="print one JSON object of all figures instead of a table")
    args = parser.parse_args(argv)
    if min(args.shards, args.shard_mib, args.workers, args.repeat, args.openssl_seconds) < 1:
        parser.error("--shards, --shard-mib, --workers, --repeat and --openssl-seconds must be positive")

    tmp = None
    directory = args.dir
    if directory is None:
        tmp = tempfile.mkdtemp(prefix="sparkfleet-bench-")
        directory = Path(tmp)
    try:
        result = run(directory, args.shards, args.shard_mib * MIB, args.workers, openssl_seconds=args.openssl_seconds,
                     repeat=args.repeat)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
