"""RAG services beside the chat model: settings, engine arguments, units, releases, host operations, and the
stand-in engine's pooling endpoints."""

from __future__ import annotations

import base64
import json
import struct
import subprocess
import sys
from pathlib import Path

import openai
import pytest
import requests
from pyinfra_testing.operations import make_operation_tests

from sparkfleet.contract import paths
from sparkfleet.model.manifest import Manifest, ManifestFile
from sparkfleet.release.plan import plan_hosts
from sparkfleet.contract.settings import SettingsError
from tests.unit.helpers import FLAGS, KEY, STANDIN, Server, host_data

CASES = Path(__file__).parent / "operations"
TestServicesPruned = make_operation_tests("sparkfleet.host", "services.services_pruned", CASES / "services_pruned")
TestServiceServing = make_operation_tests("sparkfleet.host", "services.service_serving", CASES / "service_serving")

RAG = {"embed": {"recipe": "qwen3-embedding-0.6b"}, "rerank": {"recipe": "qwen3-reranker-0.6b"}}
OVERRIDES = '{"architectures":["Qwen3ForSequenceClassification"],"classifier_from_token":["no","yes"],' \
            '"is_original_qwen3_reranker":true}'


def plan(**data):
    return plan_hosts([("spark-a", host_data(**data))])[0]


def refused(**data) -> list[str]:
    with pytest.raises(SettingsError) as caught:
        plan(**data)
    return caught.value.problems


def test_each_service_gets_the_pooling_runner_its_kind_needs():
    embed, rerank = plan(services=RAG).services
    assert embed.engine_args == [
        "/var/lib/sparkfleet/models/Qwen--Qwen3-Embedding-0.6B@unresolved", "--served-model-name",
        "Qwen3-Embedding-0.6B", "--host", "127.0.0.1", "--port", "18001", "--gpu-memory-utilization", "0.03",
        "--max-model-len", "8192", "--runner", "pooling", "--convert", "embed"]
    assert rerank.engine_args[-4:] == ["--runner", "pooling", "--hf-overrides", OVERRIDES]
    assert (rerank.unit, rerank.container, rerank.kind) == ("sparkfleet-vllm-rerank.service", "vllm-rerank", "reranker")


def test_an_entry_overrides_its_recipe():
    svc = plan(services={"vectors": {"recipe": "qwen3-embedding-0.6b", "api_port": 9100, "max_model_len": 4096,
                                     "served_model_name": "embed", "extra_engine_args": ["--max-num-seqs", "8"]}}
               ).services[0]
    assert svc.engine_args[1:] == ["--served-model-name", "embed", "--host", "127.0.0.1", "--port", "19100",
                                   "--gpu-memory-utilization", "0.03", "--max-model-len", "4096", "--runner",
                                   "pooling", "--convert", "embed", "--max-num-seqs", "8"]


def test_the_default_rag_host_memory_plan():
    """chat 0.88 + embed 0.03 + rerank 0.03 = 0.94 of the budget 0.95; each service's fit in its 3.84 GB."""
    p = plan(services=RAG)
    assert p.memory_plan == {"budget": 0.95, "total": 0.94, "fits": True, "shares": {
        "chat": {"unit": "sparkfleet-vllm.service", "share": 0.88, "bytes": 112_640_000_000, "engine_port": 18000},
        "embed": {"unit": "sparkfleet-vllm-embed.service", "share": 0.03, "bytes": 3_840_000_000,
                  "engine_port": 18001},
        "rerank": {"unit": "sparkfleet-vllm-rerank.service", "share": 0.03, "bytes": 3_840_000_000,
                   "engine_port": 18002}},
        # the chat model first, then the services as the settings list them; each waits for the ones before
        "start": {"order": ["sparkfleet-vllm.service", "sparkfleet-vllm-embed.service",
                            "sparkfleet-vllm-rerank.service"],
                  "wait_s": 900, "serving": "/etc/sparkfleet/serving.json"}}
    fit = p.services[0].fit(128 * 10**9)
    # 3,840,000,000 - weights 1,191,586,416 - reserve 1,073,741,824 = 1,574,671,760 of KV cache;
    # 28 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 114,688 bytes/token: 13,730 tokens.
    assert (fit.kv_memory_bytes, fit.kv_bytes_per_token, fit.largest_context, fit.fits) == (
        1_574_671_760, 114_688, 13_730, True)


def test_an_oversubscribed_host_is_refused_with_every_share_and_what_fits():
    problems = refused(services={**RAG, "embed": {"recipe": "qwen3-embedding-0.6b", "gpu_memory_utilization": 0.5}})
    assert problems == [
        "spark-a: the host's GPU memory is oversubscribed: gpu_memory_utilization shares sum to 1.41 > "
        "gpu_memory_budget 0.95: chat 0.88 (112.6 GB), embed 0.5 (64.0 GB), rerank 0.03 (3.8 GB). What fits: "
        "embed needs >= 0.03, rerank needs >= 0.03; beside the services' 0.53 the chat gets <= 0.42 "
        "(gpu_memory_utilization); lower a share (gpu_memory_utilization, or kv_cache_memory_bytes where set), "
        "mark a rarely used service on_demand, or move a service to another host"]


def test_a_share_too_small_for_its_model_is_refused_with_the_context_that_fits():
    problems = refused(services={"embed": {"recipe": "qwen3-embedding-0.6b", "gpu_memory_utilization": 0.02}})
    assert len(problems) == 1 and problems[0].startswith("spark-a: service 'embed': max_model_len=8192 needs")
    assert problems[0].endswith("(its share: services['embed'].gpu_memory_utilization)")


def test_service_ports_must_not_collide():
    problems = refused(services={"embed": {"recipe": "qwen3-embedding-0.6b", "api_port": 8090},
                                 "rerank": {"recipe": "qwen3-reranker-0.6b", "api_port": 8000}})
    assert problems == [
        "spark-a: port 8000 is taken by api_port and services['rerank'].api_port: give each its own port",
        "spark-a: port 8090 is taken by peer_port and services['embed'].api_port: give each its own port"]


@pytest.mark.parametrize("entry,expected", [
    ({"recipe": "qwen3-embeding-0.6b"}, "spark-a: service 'embed' (setting `services`): no recipe named "
                                        "'qwen3-embeding-0.6b'; the catalogue has: "),
    ({"recipe": "qwen3.5-35b-a3b-fp8"}, "spark-a: service 'embed' (setting `services`): set `api_port` (a chat "
                                        "recipe has none: the host's is its own model's)"),
    ({"recipe": "qwen3.5-35b-a3b-fp8-sglang", "api_port": 8003}, "spark-a: service 'embed' (setting `services`): "
     "recipe 'qwen3.5-35b-a3b-fp8-sglang' or the entry runs it on engine 'sglang', which reads no API key from the "
     "host's engine.env: a chat service runs on engine = \"vllm\" or engine = \"llamacpp\": choose such a recipe "
     "or `engine`, or give the model a host of its own"),
    ({"recipe": "qwen3-embedding-0.6b", "extra_engine_args": ["--runner", "generate"]},
     "spark-a: service 'embed': extra_engine_args: `--runner` is set by sparkfleet from the recipe's kind"),
    ({"recipe": "qwen3-embedding-0.6b", "extra_engine_args": ["--no-such-flag"]},
     "spark-a: service 'embed': `--no-such-flag` is not a flag of vLLM 0.33.0"),
    ({"recipe": "qwen3-embedding-0.6b", "extra_engine_args": ["--api-key", "x"]},
     "spark-a: service 'embed': extra_engine_args: `--api-key` would put a secret in the world-readable unit"),
    ({"recipe": "qwen3-embedding-0.6b", "extra_engine_args": ["--port=9"]},
     "spark-a: service 'embed': extra_engine_args: `--port` is set by sparkfleet from `api_port`"),
])
def test_bad_service_entries_name_the_service_and_the_fix(entry, expected):
    problems = refused(services={"embed": entry})
    assert any(p.startswith(expected) for p in problems), problems


@pytest.mark.parametrize("services,expected", [
    ({"embed": {"recipe": "qwen3-embedding-0.6b", "api_prot": 8001}},
     "spark-a: unknown key `api_prot` in service 'embed' (setting `services`): did you mean `api_port`?"),
    ({"Embed": {"recipe": "qwen3-embedding-0.6b"}},
     "spark-a: setting `services['Embed'] (key)` is invalid: must be a service name"),
    ({"embed": {"api_port": 8001}}, "spark-a: setting `services['embed']['recipe']` is missing: set it in that entry"),
    ({"embed": {"recipe": "qwen3-embedding-0.6b", "served_model_name": "a b\nExecStartPre=/bin/id"}},
     "spark-a: setting `services['embed']['served_model_name']` is invalid"),
])
def test_service_settings_are_typed(services, expected):
    problems = refused(services=services)
    assert len(problems) == 1 and problems[0].startswith(expected), problems
    assert "ExecStartPre" not in problems[0]


def test_adding_services_changes_the_release_but_not_the_chat_unit():
    """The host's release covers its services (the idempotent re-run and the record); the chat unit names the
    chat's own part, so adding an embedding model never restarts the chat model."""
    resolve = fake_resolver()
    alone = plan_hosts([("spark-a", host_data())], resolve=resolve)[0]
    rag = plan_hosts([("spark-a", host_data(services=RAG))], resolve=resolve)[0]
    assert alone.release_id == alone.chat_release_id == rag.chat_release_id != rag.release_id
    assert rag.render_unit() == alone.render_unit()
    assert "release" in rag.render_unit() and rag.release_id not in rag.render_unit()
    record = rag.release_record({})
    assert record["services"]["embed"]["model_dir"] == "/var/lib/sparkfleet/models/Qwen--Qwen3-Embedding-0.6B@" + \
        "e" * 16
    assert record["service_model_dirs"] == ["/var/lib/sparkfleet/models/Qwen--Qwen3-Embedding-0.6B@" + "e" * 16,
                                            "/var/lib/sparkfleet/models/Qwen--Qwen3-Reranker-0.6B@" + "e" * 16]
    assert "services" not in alone.release_record({}) and "service_model_dirs" not in alone.release_record({})
    # every unit the release runs, so a rollback brings back the services' units too (and none a newer one added)
    assert record["units"] == ["sparkfleet-vllm.service", "sparkfleet-vllm-embed.service",
                               "sparkfleet-vllm-rerank.service"]
    assert alone.release_record({})["units"] == ["sparkfleet-vllm.service"]


def test_a_dropped_services_model_stays_while_its_release_can_be_rolled_back_to():
    resolve = fake_resolver()
    rag = plan_hosts([("spark-a", host_data(services=RAG))], resolve=resolve)[0]
    alone = plan_hosts([("spark-a", host_data())], resolve=resolve)[0]
    record = alone.release_record(rag.release_record({}))
    assert record["previous"]["release_id"] == rag.release_id
    assert len(record["service_model_dirs"]) == 2  # the previous release's, kept for a rollback


def test_the_service_unit_runs_its_own_container_share_and_port():
    p = plan(services=RAG)
    unit = p.render_service_unit(p.services[0])
    assert "ExecStartPre=/opt/sparkfleet/bin/sparkfleet-memcheck 0.03 /etc/sparkfleet/memory.json\n" in unit
    assert "ExecStart=/usr/bin/docker run --rm --name vllm-embed \\\n" in unit
    assert "ExecStop=/usr/bin/docker stop --time 60 vllm-embed\n" in unit
    assert "    --env-file /etc/sparkfleet/engine.env \\\n" in unit  # the same API key as the chat model
    assert "    --port 18001 \\\n" in unit and "    --convert embed\n" in unit


def test_the_memory_plan_file_is_the_planners_plan_and_names_every_engine_unit(tmp_path):
    from sparkfleet.contract.formats import memory_plan_json
    from sparkfleet.contract.shared import memory

    p = plan(services=RAG, gpu_memory_utilization=0.8)
    (tmp_path / "memory.json").write_text(memory_plan_json(p.memory_plan))  # what the service stage writes
    assert json.loads((tmp_path / "memory.json").read_text()) == p.memory_plan
    assert memory.read_memory_plan(tmp_path / "memory.json") == (0.95, {
        "sparkfleet-vllm.service": 0.8, "sparkfleet-vllm-embed.service": 0.03,
        "sparkfleet-vllm-rerank.service": 0.03})


def fake_resolver():
    """Answers for every repo with one safetensors file; commits: the chat model "c"*40, services "e"*40."""
    def resolve(s):
        commit = "e" * 40 if "0.6B" in s.model_repo else "c" * 40
        files = (ManifestFile("model.safetensors", 1000, sha256="a" * 64), ManifestFile("config.json", 10,
                                                                                          sha256="b" * 64))
        return Manifest("modelscope", s.model_repo, s.model_revision, commit, files), None, None
    return resolve


# --- the stand-in engine's pooling models -------------------------------------------------------------


def pooling_model(root: Path, hidden: int = 64) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                                                  "hidden_size": hidden, "max_position_embeddings": 512}))
    header = json.dumps({"model.norm.weight": {"dtype": "BF16", "shape": [hidden],
                                               "data_offsets": [0, 2 * hidden]}}).encode()
    (root / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * (2 * hidden))
    return root


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    s = Server(pooling_model(tmp_path_factory.mktemp("pool") / "embed"), "--served-model-name", "E",
               "--api-key", KEY, "--runner", "pooling", "--convert", "embed")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    s = Server(pooling_model(tmp_path_factory.mktemp("pool") / "rerank"), "--served-model-name", "R",
               "--api-key", KEY, "--runner", "pooling", "--hf-overrides", OVERRIDES)
    yield s
    s.stop()


def test_embeddings_through_the_official_client(embedder):
    reply = embedder.client().embeddings.create(model="E", input=["the office printer", "the printer"])
    vectors = [item.embedding for item in reply.data]
    assert [len(v) for v in vectors] == [64, 64]  # the config's hidden_size
    assert reply.usage.prompt_tokens == 5 and reply.usage.total_tokens == 5
    assert sum(x * x for x in vectors[0]) == pytest.approx(1.0)  # normalised, as vLLM's embed pooler does
    again = embedder.client().embeddings.create(model="E", input="the office printer", encoding_format="float")
    assert again.data[0].embedding == pytest.approx(vectors[0])  # deterministic, base64 (the client's default) or not


def test_embeddings_base64_is_little_endian_float32(embedder):
    body = requests.post(embedder.base + "/v1/embeddings", headers={"Authorization": f"Bearer {KEY}"},
                         json={"model": "E", "input": "x", "encoding_format": "base64"}, timeout=10).json()
    assert len(base64.b64decode(body["data"][0]["embedding"])) == 64 * 4


def test_a_pooling_model_serves_no_chat_and_a_chat_model_no_embeddings(embedder):
    with pytest.raises(openai.NotFoundError):
        embedder.client().chat.completions.create(model="E", messages=[{"role": "user", "content": "hi"}])
    assert requests.post(embedder.base + "/v1/embeddings", json={"input": "x"}, timeout=10).status_code == 401


def test_rerank_orders_documents_by_relevance(reranker):
    body = requests.post(reranker.base + "/v1/rerank", headers={"Authorization": f"Bearer {KEY}"}, json={
        "model": "R", "query": "capital of China", "top_n": 2,
        "documents": ["bananas grow in the tropics", "Beijing is the capital of China", "China"]}, timeout=10).json()
    assert [(r["index"], r["relevance_score"]) for r in body["results"]] == [(1, 1.0), (2, 0.333333)]
    assert body["results"][0]["document"]["text"] == "Beijing is the capital of China"
    # the query's 3 words with each document (3 x 3) and the documents' 5 + 6 + 1 words
    assert body["usage"] == {"prompt_tokens": 21, "total_tokens": 21} and body["id"].startswith("rerank-")


def test_score_pairs_one_query_with_each_document(reranker):
    body = requests.post(reranker.base + "/v1/score", headers={"Authorization": f"Bearer {KEY}"}, json={
        "model": "R", "text_1": "capital of China", "text_2": ["Beijing is the capital of China", "bananas"]},
        timeout=10).json()
    assert [(d["index"], d["object"], d["score"]) for d in body["data"]] == [(0, "score", 1.0), (1, "score", 0.0)]


def test_rerank_of_an_unknown_model_is_404(reranker):
    reply = requests.post(reranker.base + "/v1/rerank", headers={"Authorization": f"Bearer {KEY}"},
                          json={"model": "nope", "query": "a", "documents": ["a"]}, timeout=10)
    assert reply.status_code == 404 and "nope" in reply.json()["error"]["message"]


def test_bad_hf_overrides_fail_at_start(tmp_path):
    proc = subprocess.run([sys.executable, str(STANDIN), "--flags-file", str(FLAGS),
                           str(pooling_model(tmp_path / "m")), "--runner", "pooling", "--hf-overrides", "{not json"],
                          capture_output=True, text=True, timeout=30, env={"SIM_LOAD_DELAY_S": "0", "PATH": "/usr/bin"})
    assert proc.returncode == 1 and "--hf-overrides is not a JSON object" in proc.stderr


# --- the front door routes by the model a request names -------------------------------------------------


def door_plans(**per_host):
    base = {"api_host": "0.0.0.0", "api_key": KEY, "front_door_users": {"alice": "alice-key-0123456789abcdef"},
            "front_door_allow_http": True}
    hosts = [(name, host_data(**{**base, "lan_address": f"10.0.0.{n}", **over}))
             for n, (name, over) in enumerate(per_host.items(), 1)]
    return {p.name: p for p in plan_hosts(hosts)}


def rag_door():
    """The front door of two Sparks serving the RAG models: both the embedding model, one the reranker."""
    from sparkfleet.roles.front_door import plan as fd_plan

    return fd_plan.front_door_plan("spark-a", door_plans(**{"spark-a": {"services": RAG},
                                                         "spark-b": {"services": {"embed": RAG["embed"]}}}))


def test_the_front_door_routes_each_service_model_to_the_hosts_serving_it():
    door = rag_door()
    assert [(r.backend, r.served_name, r.kind, [(b.name, b.address, b.port) for b in r.backends])
            for r in door.routes] == [
        ("model_0", "Qwen3-Embedding-0.6B", "embedding",
         [("spark-a", "10.0.0.1", 8001), ("spark-b", "10.0.0.2", 8001)]),
        ("model_1", "Qwen3-Reranker-0.6B", "reranker", [("spark-a", "10.0.0.1", 8002)])]
    config = door.config()
    assert ("    use_backend model_0 if { var(txn.model) -m str Qwen3-Embedding-0.6B } "
            "{ path -m str /v1/embeddings }\n") in config
    assert ("unless { path -m str /v1/chat/completions /v1/completions /v1/embeddings /v1/models /v1/rerank "
            "/v1/score }\n") in config  # what a user key reaches: the chat paths and the routes' own
    assert ("http-check send meth POST uri /v1/rerank ver HTTP/1.1 hdr Host front-door hdr Content-Type "
            "application/json hdr Authorization %[str(engines),map(/etc/sparkfleet/front-door/backend.map)] body "
            """'{"model":"Qwen3-Reranker-0.6B","query":"ping","documents":["ping","pong"]}'""") in config


@pytest.mark.haproxy
def test_haproxy_takes_the_front_doors_routes(tmp_path):
    """Debian's HAProxy parses the routed door's config (`haproxy -c`), its files moved under tmp_path."""
    from .helpers import door_files

    door = rag_door()
    (tmp_path / "haproxy.cfg").write_text(door.config().replace(paths.FRONT_DOOR_DIR, str(tmp_path)).replace(
        paths.FRONT_DOOR_SOCKET, str(tmp_path / "admin.sock")).replace(paths.FRONT_DOOR_STATE_FILE,
                                                                         str(tmp_path / "state")))
    door_files(door, tmp_path)
    check = subprocess.run(["haproxy", "-c", "-f", str(tmp_path / "haproxy.cfg")], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_front_door_without_services_has_no_model_routes():
    from sparkfleet.roles.front_door import plan as fd_plan

    config = fd_plan.front_door_plan("spark-a", door_plans(**{"spark-a": {}})).config()
    assert "txn.model" not in config and "model_0" not in config


def test_one_served_name_of_two_kinds_behind_one_front_door_is_refused():
    from sparkfleet.roles.front_door import plan as fd_plan

    twin = {"rerank": {"recipe": "qwen3-reranker-0.6b", "served_model_name": "Qwen3-Embedding-0.6B"}}
    with pytest.raises(SettingsError) as caught:
        fd_plan.front_door_plan("spark-a", door_plans(**{"spark-a": {"services": {"embed": RAG["embed"]}},
                                                   "spark-b": {"services": twin}}))
    assert caught.value.problems == [
        "spark-a: services named 'Qwen3-Embedding-0.6B' behind this front door are of different kinds "
        "(embedding and reranker): give each kind its own served_model_name"]


def test_status_asks_each_service_with_the_arguments_its_probe_takes():
    """A probe called with arguments its command does not take counts as "not answering": a healthy service
    would be reported down (seen when the probe gained the container it checks before sending the key)."""
    from sparkfleet.fleet.status import services_status

    class Host:
        def get_fact(self, fact, **kwargs):
            command = fact().command(**kwargs)
            assert "--container vllm-embed" in command and "--port 18001" in command
            return {"serving": True, "detail": ""}

    release = {"services": {"embed": {"kind": "embedding", "api_port": 8001, "served_model_name": "E",
                                      "container": "vllm-embed"}}}
    assert services_status(Host(), release)["embed"]["serving"] is True
