"""model/gguf.py: the header reader (files written by the `gguf` package; hostile headers built by hand), its
config.json-style view, the fit and roofline of a GGUF model, and `model_files` selecting a manifest's files."""

import struct

import pytest

from sparkfleet.model import gguf
from sparkfleet.model.config import config_problem, model_shape
from sparkfleet.model.fit import check_fit, fit_report, param_counts
from sparkfleet.model.manifest import Manifest, ManifestFile, selected

GB = 10**9


def write_gguf(path, arch="llama", *, layers=2, heads=4, kv_heads=2, hidden=64, ctx=4096, ff=128, vocab=300,
               experts=0, used=0, expert_ff=None, head_dim=None, name="tiny test model",
               tensor_shape=(4, 8)):
    """A real GGUF file written by the `gguf` package (skips the test when it is not importable)."""
    gguf_pkg = pytest.importorskip("gguf")
    np = pytest.importorskip("numpy")
    w = gguf_pkg.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_block_count(layers)
    w.add_context_length(ctx)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim or hidden // heads)
    w.add_value_length(head_dim or hidden // heads)
    w.add_file_type(1)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(used)
        if expert_ff:
            w.add_expert_feed_forward_length(expert_ff)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(vocab)])
    w.add_chat_template("{{ messages }}")
    w.add_tensor("token_embd.weight", np.zeros(tensor_shape, dtype=np.float16))  # the planner reads none
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_written_file_reads_back_and_becomes_the_planners_config(tmp_path):
    data = write_gguf(tmp_path / "m.gguf", vocab=5000).read_bytes()
    header = gguf.read_header(data)
    assert header.version == 3 and header.tensor_count == 1
    assert header.metadata["general.architecture"] == "llama"
    assert header.metadata["llama.block_count"] == 2
    assert len(header.metadata["tokenizer.ggml.tokens"]) == 5000  # long: kept as its length only
    assert isinstance(header.metadata["tokenizer.ggml.tokens"], gguf.LongArray)
    assert header.kv_end < len(data)
    config = gguf.planner_config(header.metadata)
    assert {k: config[k] for k in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                   "hidden_size", "head_dim", "max_position_embeddings", "vocab_size",
                                   "intermediate_size", "model_type")} == {
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64,
        "head_dim": 16, "max_position_embeddings": 4096, "vocab_size": 5000, "intermediate_size": 128,
        "model_type": "llama"}
    assert config["gguf"] == {"file_type": 1, "name": "tiny test model"}
    assert config_problem(config, "t/t") is None
    assert model_shape(config).num_kv_heads == 2


@pytest.mark.parametrize("vocab", [300, 5000])  # the vocabulary kept, or stepped over
def test_every_prefix_of_a_header_asks_for_more_and_never_reads_past_its_end(tmp_path, vocab):
    data = write_gguf(tmp_path / "m.gguf", vocab=vocab).read_bytes()
    end = gguf.read_header(data).kv_end
    for cut in (0, 3, 4, 10, 24, end // 3, end // 2, end - 1):
        with pytest.raises(gguf.Truncated) as caught:
            gguf.read_header(data[:cut])
        assert cut < caught.value.needed <= end
    assert gguf.read_header(data[:end]).kv_end == end


def test_a_gpt_oss_shaped_moe_gets_the_sane_fit_and_roofline(tmp_path):
    """gpt-oss-120b's shape (36 layers, 64 heads of 64, 8 KV heads, 128 experts of 2880, 4 active, vocab
    201,088) in ~63 GB of MXFP4 GGUF: ~117 B parameters of which ~5 B active, so one token reads ~2.9 GB and
    a Spark's 273 GB/s bounds decode near 90 tokens/s; f16 KV at 2 x 36 x 8 x 64 x 2 = 73,728 bytes a token."""
    path = write_gguf(tmp_path / "gpt-oss.gguf", "gpt-oss", layers=36, heads=64, kv_heads=8, hidden=2880,
                      head_dim=64, ctx=131072, ff=2880, vocab=201088, experts=128, used=4, expert_ff=2880)
    config = gguf.header_config(path.read_bytes())
    params = param_counts(config)
    assert 110e9 < params.total < 125e9 and 4e9 < params.active < 6.5e9
    report = fit_report(config, 63 * GB, max_model_len=131072)
    assert report.kv_bytes_per_token == 73_728
    assert report.weights_bytes == report.estimated_weights_bytes == 63 * GB
    assert 2.2e9 < report.active_weight_bytes_per_token < 3.5e9
    assert 70 < report.decode_tokens_per_s_at_0 < 125
    assert report.fits and check_fit(report) is None


def kv(key: str, kind: int, payload: bytes) -> bytes:
    raw = key.encode()
    return struct.pack("<Q", len(raw)) + raw + struct.pack("<I", kind) + payload


def header(*pairs: bytes, version=3, tensors=0, count=None) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, tensors, len(pairs) if count is None else count) + b"".join(pairs)


ARCH = kv("general.architecture", 8, struct.pack("<Q", 5) + b"llama")


@pytest.mark.parametrize("data, problem", [
    (b"GGML" + bytes(20), "magic"),
    (header(ARCH, version=1), "version 1"),
    (header(ARCH, count=2**40), "key-value count claims"),
    (header(ARCH, tensors=2**40), "tensor count claims"),
    (header(kv("a", 8, struct.pack("<Q", 2**40))), "length claims"),
    (header(struct.pack("<Q", 2**20) + b"k"), "a key's length claims"),
    (header(kv("a", 9, struct.pack("<IQ", 4, 2**40))), "array 'a' claims"),
    (header(kv("a", 9, struct.pack("<IQ", 9, 1))), "array of arrays"),
    (header(kv("a", 9, struct.pack("<IQ", 77, 1))), "value type 77"),
    (header(kv("a", 13, b"")), "value type 13"),
    (header(ARCH, ARCH), "appears twice"),
    (header(kv("a b", 4, struct.pack("<I", 1))), "not a dotted name"),
    (header(kv("a", 8, struct.pack("<Q", 2) + b"\xff\xfe")), "not UTF-8"),
])
def test_a_hostile_header_is_refused_naming_the_problem(data, problem):
    with pytest.raises(gguf.GGUFError, match=problem):
        gguf.read_header(data)


def test_a_huge_skipped_array_is_bounded_by_the_header_cap_not_allocated():
    data = header(kv("a", 9, struct.pack("<IQ", 12, gguf.MAX_ARRAY_ITEMS)))  # 128 MiB of f64 claimed
    with pytest.raises(gguf.GGUFError, match="longer than 128 MiB"):
        gguf.read_header(data)


@pytest.mark.parametrize("metadata, problem", [
    ({}, "general.architecture"),
    ({"general.architecture": "Llama; rm"}, "general.architecture"),
    ({"general.architecture": "llama", "llama.block_count": 2}, "lacks llama.attention.head_count"),
    ({"general.architecture": "llama", "llama.block_count": "2"}, "is not a count"),
    ({"general.architecture": "llama", "llama.block_count": 1.5}, "is not a count"),
])
def test_metadata_the_planner_cannot_read_is_refused(metadata, problem):
    with pytest.raises(gguf.GGUFError, match=problem):
        gguf.planner_config(metadata)


def test_per_layer_counts_take_their_largest_and_the_config_checks_bound_the_rest():
    metadata = {"general.architecture": "x", "x.block_count": 3, "x.attention.head_count": 8,
                "x.attention.head_count_kv": (2, 4, 2), "x.embedding_length": 512, "x.context_length": 2048,
                "x.attention.key_length": 64, "x.attention.value_length": 32}
    config = gguf.planner_config(metadata)
    assert config["num_key_value_heads"] == 4 and config["head_dim"] == 48
    metadata["x.block_count"] = 10**9
    assert "num_hidden_layers" in config_problem(gguf.planner_config(metadata), "x/x")


def test_entry_file_is_the_only_gguf_or_the_first_part():
    assert gguf.entry_file(["README.md", "m-Q4_K_M.gguf"]) == "m-Q4_K_M.gguf"
    assert gguf.entry_file(["b/m-00002-of-00002.gguf", "b/m-00001-of-00002.gguf"]) == "b/m-00001-of-00002.gguf"
    assert gguf.entry_file(["config.json", "model.safetensors"]) is None
    with pytest.raises(ValueError, match="set `model_files`"):
        gguf.entry_file(["a-Q4_K_M.gguf", "a-Q8_0.gguf"])


def manifest(*paths: str) -> Manifest:
    files = tuple(ManifestFile(p, 1000 + i, f"{i:064x}") for i, p in enumerate(paths))
    return Manifest("huggingface", "org/m-GGUF", "main", "a" * 40, files)


def test_model_files_selects_the_files_and_keeps_the_default_release_id():
    whole = manifest("README.md", "m-Q4_K_M.gguf", "m-Q8_0.gguf", "big/m-00001-of-00002.gguf",
                     "big/m-00002-of-00002.gguf")
    assert selected(whole, None) is whole
    assert "selection" not in whole.to_dict() and whole.dir_name == "org--m-GGUF@aaaaaaaaaaaaaaaa"
    one = selected(whole, ["*Q4_K_M*.gguf"])
    assert [f.path for f in one.files] == ["m-Q4_K_M.gguf"] and one.weight_bytes == 1001
    assert one.dir_name.startswith("org--m-GGUF@aaaaaaaaaaaaaaaa-") and one.digest != whole.digest
    assert Manifest.from_dict(one.to_dict()) == one
    split = selected(whole, ["big/*.gguf"])
    assert gguf.entry_file([f.path for f in split.files]) == "big/m-00001-of-00002.gguf"
    assert split.weight_bytes == 1003 + 1004


def test_model_files_that_match_nothing_or_half_a_split_set_are_refused_with_the_fix():
    whole = manifest("README.md", "m-Q4_K_M.gguf", "big/m-00001-of-00002.gguf", "big/m-00002-of-00002.gguf")
    with pytest.raises(ValueError, match=r"'\*Q5\*' matches no file .*\.gguf files: m-Q4_K_M.gguf, big/m-0000"):
        selected(whole, ["*Q4*", "*Q5*"])
    with pytest.raises(ValueError, match="but not big/m-00002-of-00002.gguf: match every part"):
        selected(whole, ["big/*00001*"])


def test_weight_bytes_prefer_gguf_then_safetensors_then_everything():
    assert manifest("config.json", "model.safetensors").weight_bytes == 1001
    assert manifest("README.md", "x.bin").weight_bytes == 2001
