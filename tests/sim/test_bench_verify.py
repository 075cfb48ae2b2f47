"""tools/bench_verify.py on tiny files: figures sane and consistent, no timing thresholds."""

import json

import pytest

from sparkfleet.host.model_files import files_needing_work
from tools import bench_verify as bench

MIB = 1 << 20


def test_generated_files_verify_and_reuse(tmp_path):
    fetch = bench.load_fetch()
    entries = bench.generate_files(tmp_path, shards=3, shard_bytes=2 * MIB + 17, workers=2)
    assert [e["size"] for e in entries] == [2 * MIB + 17] * 3
    assert len({e["sha256"] for e in entries}) == 3  # distinct contents
    nbytes, _ = bench.warm_page_cache([tmp_path / e["path"] for e in entries])
    assert nbytes == 3 * (2 * MIB + 17)

    result = bench.time_verifier(fetch, tmp_path, entries, workers=2, repeat=2)
    assert result["all_ok"] and result["results"] == [True] * 3
    assert result["bytes"] == nbytes and result["gib_s"] > 0 and len(result["passes_gib_s"]) == 2

    # A damaged file is caught by the same verifier.
    target = tmp_path / entries[1]["path"]
    data = bytearray(target.read_bytes())
    data[MIB] ^= 0xFF
    target.write_bytes(bytes(data))
    assert fetch.hash_all([(tmp_path / e["path"], e) for e in entries], 2) == [True, False, True]

    # Same request again: the listing is reused, nothing regenerated (the damage stays).
    again = bench.generate_files(tmp_path, shards=3, shard_bytes=2 * MIB + 17, workers=2)
    assert again == entries and target.read_bytes() == bytes(data)


def test_hash_all_handles_blob_sha1_and_empty(tmp_path):
    from sparkfleet.model.manifest import git_blob_sha1

    fetch = bench.load_fetch()
    (tmp_path / "config.json").write_bytes(b'{"a": 1}\n')
    entry = {"path": "config.json", "size": 9, "blob_sha1": git_blob_sha1(b'{"a": 1}\n')}
    assert fetch.hash_all([(tmp_path / "config.json", entry)], 4) == [True]
    assert fetch.hash_all([], 4) == []


def test_single_core_and_reference_rates_are_positive(tmp_path):
    entries = bench.generate_files(tmp_path, shards=2, shard_bytes=MIB, workers=2)
    hl = bench.hashlib_rate(total=16 * MIB, chunk=MIB)
    assert hl["bytes"] == 16 * MIB and hl["gib_s"] > 0
    par = bench.hashlib_parallel_rate(2, per_thread=8 * MIB, chunk=MIB)
    assert par["bytes"] == 16 * MIB and par["gib_s"] > 0
    s256 = bench.sha256sum_rate(tmp_path, entries)
    assert s256.get("gib_s") is None or (s256["gib_s"] > 0 and s256["all_ok"])
    ssl = bench.openssl_rate(seconds=1)
    assert ssl["bytes_s"] is None or ssl["bytes_s"] > 0
    assert ssl["note"]


def test_parse_openssl_speed():
    out = ("version: 3.0.19\nThe 'numbers' are in 1000s of bytes per second processed.\n"
           "type          16384 bytes\nsha256         1507988.25k\n")
    assert bench.parse_openssl_speed(out) == 1507988.25 * 1000
    assert bench.parse_openssl_speed("no figures here") is None


def test_synthetic_model_is_shaped_like_the_default_and_needs_no_work():
    manifest, record, stats = bench.synthetic_model()
    shards = [f for f in manifest.files if f.path.endswith(".safetensors")]
    assert len(shards) == 14 and len(manifest.files) == 24
    assert 37e9 < manifest.total_bytes < 39e9
    assert files_needing_work(manifest, record, stats) == []
    timed = bench.time_files_needing_work(manifest, record, stats, calls=10, rounds=2)
    assert timed["needed"] == [] and timed["seconds"] > 0 and timed["files"] == 24
    # The decision is real: a changed inode or a missing record entry needs work.
    shard = shards[3].path
    assert files_needing_work(manifest, record, {**stats, shard: {**stats[shard], "ino": 7}}) == [shard]
    assert files_needing_work(manifest, {k: v for k, v in record.items() if k != shard}, stats) == [shard]
    assert len(files_needing_work(manifest, record, stats, full_verify=True)) == 24


def test_reverify_with_vouching_record_reads_no_file_bytes(tmp_path):
    fetch = bench.load_fetch()
    model = tmp_path / "model"
    entries = bench.generate_files(model, shards=2, shard_bytes=3 * MIB, workers=2)
    bench.write_record(fetch, model, entries)
    record = json.loads((model / ".sparkfleet-verified.json").read_text())
    assert set(record) == {e["path"] for e in entries}

    result = bench.reverify_with_record(fetch, model, entries, workers=2)
    assert result["rc"] == 0 and result["rehashed"] == 0 and result["fetched"] == []
    assert result["process_rehashed"] == 0 and result["process_seconds"] > 0 and result["seconds"] > 0
    if result["rchar"] is not None:  # /proc/self/io: only the job and the record were read
        assert 0 <= result["rchar"] < MIB <= result["file_bytes"]

    # Without the record's word, the same path hashes every file.
    full = bench.reverify_with_record(fetch, model, entries, workers=2, full_verify=True, subprocess_too=False)
    assert full["rc"] == 0 and full["rehashed"] == 2
    if full["rchar"] is not None:
        assert full["rchar"] >= full["file_bytes"]


OPENSSL_GIB_S = 2.0  # a fixed single-core figure: the CLI tests check the arithmetic, not this machine


@pytest.fixture
def quick_rates(monkeypatch):
    """`openssl speed` answers OPENSSL_GIB_S at once, and the in-memory hashlib rates hash 16 MiB, not 256."""
    rate, parallel = bench.hashlib_rate, bench.hashlib_parallel_rate
    monkeypatch.setattr(bench, "openssl_rate", lambda seconds=3: {
        "bytes_s": OPENSSL_GIB_S * bench.GIB, "gib_s": OPENSSL_GIB_S, "note": "fixed by the test"})
    monkeypatch.setattr(bench, "hashlib_rate", lambda total=0, chunk=MIB: rate(16 * MIB, chunk))
    monkeypatch.setattr(bench, "hashlib_parallel_rate", lambda threads, per_thread=0, chunk=MIB:
                        parallel(threads, 16 * MIB // threads, chunk))


def test_run_and_cli_json(tmp_path, capsys, quick_rates):
    assert bench.main(["--dir", str(tmp_path / "d"), "--shards", "2", "--shard-mib", "2", "--workers", "2",
                       "--repeat", "1", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["shards"] == 2 and r["lanes"] == min(r["cores"], 2)
    assert r["verifier"]["all_ok"] and r["verifier"]["bytes"] == 4 * MIB and r["verifier"]["gib_s"] > 0
    assert r["hashlib_single_core"]["bytes"] == 16 * MIB and r["hashlib_parallel_in_memory"]["gib_s"] > 0
    assert r["openssl_single_core"]["gib_s"] == OPENSSL_GIB_S
    # the verifier against the openssl limit of its lanes: its GiB/s over lanes x 2.0 GiB/s
    assert r["ratio_verifier_vs_openssl_limit"] == pytest.approx(r["verifier"]["gib_s"] / (r["lanes"] * 2.0))
    assert r["ratio_target"] == 0.8 and r["meets_target"] == (r["verifier"]["gib_s"] >= 0.8 * r["lanes"] * 2.0)
    if r["sha256sum"].get("gib_s"):
        assert r["sha256sum"]["all_ok"]
    assert r["files_needing_work"]["needed"] == [] and r["files_needing_work"]["seconds"] > 0
    assert r["reverify_with_record"]["rehashed"] == 0
    assert (tmp_path / "d").is_dir()  # --dir is kept


def test_cli_table_cleans_its_temp_dir(tmp_path, monkeypatch, capsys, quick_rates):
    monkeypatch.setattr(bench.tempfile, "tempdir", str(tmp_path))
    assert bench.main(["--shards", "1", "--shard-mib", "1", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "verifier" in out and "GiB/s" in out
    assert list(tmp_path.iterdir()) == []
