"""RAG beside the chat model on one Spark: an embedding model and a reranker in their own vLLM units and
ports, converged with the chat model, answering, idempotent, refused when oversubscribed, and removed
when dropped from the settings."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time

import requests
from openai import OpenAI

from sparkfleet.contract import paths
from tests.waiting import wait_until
from tests.e2e.conftest import (
    ENGINE_PATHS,
    HOSTS,
    ROOT,
    container,
    converge,
    lan_statuses,
    sparkfleet,
    ssh,
    started_at,
    variant,
)

HOST = "spark-1"
SERVICES = {"embed": {"recipe": "qwen3-embedding-0.6b"}, "rerank": {"recipe": "qwen3-reranker-0.6b"}}
UNITS = ("sparkfleet-vllm-embed.service", "sparkfleet-vllm-rerank.service")
SERVED = {8001: ("/v1/models", "/v1/embeddings", "/metrics"), 8002: ("/v1/models", "/v1/rerank", "/v1/score", "/metrics")}


@contextlib.contextmanager
def tunnel(state: dict, host: str, remote_port: int):
    """127.0.0.1:<free port> on the controller forwarded over SSH to the host's loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        local = s.getsockname()[1]
    port = next(h["ssh_port"] for h in state["hosts"] if h["name"] == host)
    proc = subprocess.Popen(["ssh", "-N", "-i", state["ssh_key"], "-p", str(port), "-o", "StrictHostKeyChecking=no",
                             "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                             "-o", "ExitOnForwardFailure=yes",
                             "-L", f"127.0.0.1:{local}:127.0.0.1:{remote_port}", "root@127.0.0.1"])
    try:
        wait_until(lambda: socket.create_connection(("127.0.0.1", local), timeout=1).close() or True, 20,
                   "the SSH tunnel", step_s=0.3, ignore=(OSError,))
        yield f"http://127.0.0.1:{local}"
    finally:
        proc.terminate()
        proc.wait(10)


def installed_services(state: dict, host: str) -> str:
    return ssh(state, host, "ls /etc/systemd/system | grep '^sparkfleet-vllm-' || true; "
                            "docker ps --format '{{.Names}}' | grep '^vllm-' || true")


def status_of_services(inventory: str) -> tuple[int, dict]:
    """`sparkfleet status --json`: its exit status and whether each service of HOST answers."""
    proc = sparkfleet("status", inventory, "--json")
    row = next(r for r in json.loads(proc.stdout)["hosts"] if r["host"] == HOST)
    return proc.returncode, {name: svc["serving"] for name, svc in row["ssh"]["services"].items()}


def test_oversubscribed_host_is_refused_by_plan_with_each_share(sim_fleet, tmp_path):
    greedy = {**SERVICES, "embed": {"recipe": "qwen3-embedding-0.6b", "gpu_memory_utilization": 0.7}}
    proc = sparkfleet("plan", variant(tmp_path, "greedy", {}, {HOST: {"services": greedy}}))
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    assert "gpu_memory_utilization shares sum to 1.03 > gpu_memory_budget 0.95" in out
    assert "chat 0.3 (38.4 GB), embed 0.7 (89.6 GB), rerank 0.03 (3.8 GB)" in out
    assert "embed needs >= 0.03, rerank needs >= 0.03" in out and "the chat gets <= 0.22" in out
    assert installed_services(sim_fleet, HOST) == ""  # a plan touches no host


def test_chat_embeddings_and_rerank_on_one_spark(converged_fleet, tmp_path):
    state = converged_fleet
    rag = variant(tmp_path, "rag", {}, {HOST: {"services": SERVICES}})
    chat_started = started_at(state, HOST)
    try:
        first = converge(inventory=rag)
        assert first.returncode == 0 and not any(first.failed.values()), first.output[-5000:]
        assert "Service | Service embed (embedding, port 8001) enabled and running" in first.changed[HOST], \
            first.changed[HOST]
        assert started_at(state, HOST) == chat_started  # adding services leaves the chat model running

        record = json.loads(ssh(state, HOST, "cat /etc/sparkfleet/release.json"))
        assert {name: (svc["unit"], svc["api_port"], svc["kind"]) for name, svc in record["services"].items()} == {
            "embed": ("sparkfleet-vllm-embed.service", 8001, "embedding"),
            "rerank": ("sparkfleet-vllm-rerank.service", 8002, "reranker")}
        memory = json.loads(ssh(state, HOST, f"cat {paths.MEMORY_PLAN}"))  # the planner's plan, as memcheck reads it
        assert (memory["budget"], {row["unit"]: row["share"] for row in memory["shares"].values()}) == (0.95, {
            "sparkfleet-vllm.service": 0.3, "sparkfleet-vllm-embed.service": 0.03,
            "sparkfleet-vllm-rerank.service": 0.03})

        for port, served in SERVED.items():  # from another host: only through the guard, only its paths
            lan = f"http://{container('spark-1')}:{port}"
            for key in (None, "demo-user-key-0123456789"):
                assert lan_statuses(state, "spark-2", lan, key=key) == {
                    p: "200" if p == "/health" else "401" for p in ENGINE_PATHS}, (port, key)
            keyed = lan_statuses(state, "spark-2", lan, key="sim-key")
            assert (keyed["/v1/models"], keyed["/metrics"]) == ("200", "200"), (port, keyed)
            assert {p: keyed[p] for p in ENGINE_PATHS if p not in ("/health", *served)} == {
                p: "404" for p in ENGINE_PATHS if p not in ("/health", *served)}, port
            assert lan_statuses(state, "spark-2", f"http://{container('spark-1')}:{port + 10000}", ("/health",)) == {
                "/health": "000"}, port  # the engine itself: loopback only

        with tunnel(state, HOST, 8001) as embed_url, tunnel(state, HOST, 8002) as rerank_url:
            client = OpenAI(base_url=f"{embed_url}/v1", api_key="sim-key", max_retries=0)
            reply = client.embeddings.create(model="Qwen3-Embedding-0.6B",
                                             input=["where is the office printer", "the printer is on floor two"])
            assert [len(item.embedding) for item in reply.data] == [1024, 1024]  # the config's hidden_size
            assert reply.usage.prompt_tokens == 11
            ranked = requests.post(f"{rerank_url}/v1/rerank", headers={"Authorization": "Bearer sim-key"}, json={
                "model": "Qwen3-Reranker-0.6B", "query": "office printer floor",
                "documents": ["the canteen opens at noon", "the office printer is on floor two"]}, timeout=30)
            assert ranked.status_code == 200, ranked.text
            assert [r["index"] for r in ranked.json()["results"]] == [1, 0]
            assert requests.post(f"{rerank_url}/v1/rerank", json={"query": "q", "documents": ["d"]},
                                 timeout=30).status_code == 401  # the API key guards the services too
            assert requests.post(f"{embed_url}/v1/chat/completions", headers={"Authorization": "Bearer sim-key"},
                                 json={"messages": [{"role": "user", "content": "hi"}]}, timeout=30).status_code == 404

        again = converge(inventory=rag)
        assert again.returncode == 0, again.output[-5000:]
        assert {h: again.changed[h] for h in HOSTS} == {h: [] for h in HOSTS}

        assert status_of_services(rag) == (0, {"embed": True, "rerank": True})
        infra = subprocess.run([sys.executable, "-m", "pytest", "tests/infra/test_services.py", "--inventory", rag,
                                "--limit", HOST, "-q", "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True,
                               text=True, timeout=600)
        assert infra.returncode == 0 and "5 passed" in infra.stdout, infra.stdout[-3000:]

        ssh(state, HOST, "systemctl stop sparkfleet-vllm-rerank.service")  # a service that stopped answering
        assert status_of_services(rag) == (1, {"embed": True, "rerank": False})
        healed = converge(inventory=rag)
        assert healed.returncode == 0 and not any(healed.failed.values()), healed.output[-5000:]
        assert healed.changed[HOST] == ["Service | Service rerank (reranker, port 8002) enabled and running",
                                        "Health gate | Qwen3-Reranker-0.6B answers on port 8002"], healed.changed
        assert status_of_services(rag) == (0, {"embed": True, "rerank": True})

        # a boot starts every unit at once: the engines load one at a time, each after the one before answers
        chat_units = " ".join(("sparkfleet-vllm.service", *UNITS))
        answered = [float(t) for t in ssh(state, HOST, (
            f"systemctl stop {chat_units} && systemctl start --no-block {chat_units} && "
            "for port in 18000 18001; do "
            "until curl -sf -o /dev/null http://127.0.0.1:$port/health; do sleep 0.2; done; date +%s.%N; done"),
            ).split()]
        wait_until(lambda: status_of_services(rag) == (0, {"embed": True, "rerank": True}), 300, "both serving")
        started = [float(t) for t in ssh(state, HOST, "for c in vllm vllm-embed vllm-rerank; do "
                                                      "date -d \"$(docker inspect -f '{{.State.StartedAt}}' $c)\" "
                                                      "+%s.%N; done").split()]
        print(f"engines started at +0, +{started[1] - started[0]:.1f} s, +{started[2] - started[0]:.1f} s; "
              f"the chat answered at +{answered[0] - started[0]:.1f} s, embed at +{answered[1] - started[0]:.1f} s")
        assert started[1] >= answered[0] - 0.5, (started, answered)  # embed's container after the chat answered
        assert started[2] >= answered[1] - 0.5, (started, answered)  # rerank's after embed answered
        journal = ssh(state, HOST, f"journalctl -u {UNITS[1]} --no-pager | grep sparkfleet-memcheck")
        assert f"{UNITS[1]} waited " in journal, journal  # the journal says how long the start waited
        chat_started = started_at(state, HOST)  # dropping the services below leaves the chat model running
    finally:
        back = converge()
    assert back.returncode == 0 and not any(back.failed.values()), back.output[-5000:]
    assert installed_services(state, HOST) == ""  # dropped services: units stopped and removed
    assert started_at(state, HOST) == chat_started


def test_a_rag_release_failing_its_gate_is_rolled_back_with_the_services_previous_units(converged_fleet, tmp_path):
    """Issue 22: a release that changes both services' settings and fails its gate (the engine refuses embed's new
    flag at start) is rolled back: each service's unit file and its running container's arguments are the previous
    release's again, and the chat engine, which that release left untouched, was never restarted (a restored
    service restarts, so its start time is the rollback's)."""
    state = converged_fleet
    rag = variant(tmp_path, "rag", {}, {HOST: {"services": SERVICES}})
    bad = variant(tmp_path, "rag-bad", {}, {HOST: {"health_timeout_s": 20, "services": {
        "embed": {**SERVICES["embed"], "max_model_len": 2048, "extra_engine_args": ["--max-num-seqs", "-1"]},
        "rerank": {**SERVICES["rerank"], "max_model_len": 1024}}}})

    def services_now() -> dict[str, tuple[str, str]]:
        return {unit: (ssh(state, HOST, f"cat {paths.unit_path(unit)}"),
                       ssh(state, HOST, f"docker inspect -f '{{{{json .Args}}}}' vllm-{name}"))
                for unit, name in zip(UNITS, SERVICES)}

    try:
        first = converge(inventory=rag)
        assert first.returncode == 0 and not any(first.failed.values()), first.output[-5000:]
        before, chat_started = services_now(), started_at(state, HOST)
        assert all('"--max-model-len","8192"' in args for _, args in before.values()), before  # the recipes'
        took = time.monotonic()
        proc = sparkfleet("rollout", bad, "--batch", "1", "--json")
        took = time.monotonic() - took
        assert proc.returncode != 0, proc.stdout[-3000:]
        row = next(r for r in json.loads(proc.stdout)["hosts"] if r["host"] == HOST)
        assert row["result"] == "rolled back" and "previous release restored" in row["detail"], row
        assert services_now() == before
        assert started_at(state, HOST) == chat_started
        assert status_of_services(rag) == (0, {"embed": True, "rerank": True})
        kept = ssh(state, HOST, f"cat {paths.PREVIOUS_DIR}/{UNITS[0]}")  # the failed release's, for a second rollback
        assert "--max-num-seqs" in kept and "--max-num-seqs" not in before[UNITS[0]][0]
        print(f"rollout and rollback took {took:.0f} s")
    finally:
        back = converge()
    assert back.returncode == 0 and not any(back.failed.values()), back.output[-5000:]
    assert installed_services(state, HOST) == ""


def test_a_second_chat_model_on_one_spark_answers_through_the_front_door_by_name(converged_fleet, tmp_path):
    """spark-1 serves the chat model and, in its own unit and port, a second chat model (a release of its own): both
    answer through the front door by name, /v1/models lists both, a converge after changes nothing, and dropping it
    leaves the first model running."""
    from .test_front_door import USERS, deploy, door_inventory, door_port

    second = {"recipe": "qwen3.5-35b-a3b-fp8", "served_model_name": "Qwen3.5-35B-A3B-long", "api_port": 8003,
              "kv_cache_memory_bytes": 2**31, "max_model_len": 32768}
    base = door_inventory(tmp_path, "door", USERS)
    two = str(tmp_path / "two.py")
    with open(two, "w") as out:
        out.write(f"import runpy\n_d = runpy.run_path({base!r})\n"
                  f"sparks = [(n, {{**d, **({{'services': {{'long': {second!r}}}, 'watchdog_interval_s': 5}}"
                  f" if n == {HOST!r} else {{}})}})"
                  f" for n, d in _d['sparks']]\nfront_door = _d['front_door']\nmonitoring = _d['monitoring']\n")
    chat_started = started_at(converged_fleet, HOST)
    try:
        first = converge(inventory=two)
        assert first.returncode == 0 and not any(first.failed.values()), first.output[-5000:]
        assert started_at(converged_fleet, HOST) == chat_started  # the first model kept running
        client = OpenAI(base_url=f"http://127.0.0.1:{door_port()}/v1", api_key=USERS["alice"])
        listed = sorted(m.id for m in client.models.list().data)
        assert listed == ["Qwen3.5-35B-A3B", "Qwen3.5-35B-A3B-long"], listed
        for model in listed:
            reply = client.chat.completions.create(model=model, max_tokens=8,
                                                   messages=[{"role": "user", "content": "hello"}])
            assert reply.model == model and reply.usage.completion_tokens > 0, reply
        served = ssh(converged_fleet, HOST, "docker inspect -f '{{.Args}}' vllm-long")
        assert "--served-model-name Qwen3.5-35B-A3B-long" in served and "--port 18003" in served, served
        assert f"--kv-cache-memory-bytes {2**31}" in served, served
        assert "--reasoning-parser qwen3" in served  # its recipe's own, not inherited: the recipe sets it too
        again = converge(inventory=two)
        assert again.returncode == 0, again.output[-5000:]
        assert not any(again.changed.values()), again.changed  # the Sparks and the door
        infra = subprocess.run([sys.executable, "-m", "pytest", "tests/infra/test_services.py", "--inventory", two,
                                "--limit", HOST, "-q", "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True,
                               text=True, timeout=600)
        assert infra.returncode == 0 and "5 passed" in infra.stdout, infra.stdout[-3000:]  # the suite, per model

        # the second model frozen: the watchdog restarts it alone (a probe every 5 s here), no command
        frozen_at = ssh(converged_fleet, HOST,
                        "docker inspect -f '{{.State.StartedAt}}' vllm-long; docker pause vllm-long")
        wait_until(lambda: ssh(converged_fleet, HOST, "docker inspect -f '{{.State.StartedAt}}' vllm-long",
                               check=False) not in ("", frozen_at), 120, "the watchdog restarted vllm-long")
        wait_until(lambda: client.chat.completions.create(model="Qwen3.5-35B-A3B-long", max_tokens=8, messages=[
            {"role": "user", "content": "back?"}]).usage.completion_tokens > 0, 120, "the second model answers again",
            ignore=(Exception,))
        assert started_at(converged_fleet, HOST) == chat_started  # the first model was never touched
    finally:
        back = deploy(base)
    assert back.returncode == 0, back.stdout[-3000:] + back.stderr[-3000:]
    assert installed_services(converged_fleet, HOST) == ""
    assert started_at(converged_fleet, HOST) == chat_started
