"""A chat service on its own engine and image: a llama.cpp model beside a host's vLLM one, planned with
llama-server's arguments, its own image pinned by digest (the lock holds both images) and run by its unit; and
every inventory without such a service plans exactly the releases, units and files it planned before."""

from __future__ import annotations

import hashlib
import json

import pytest

from sparkfleet.contract.settings import SettingsError
from sparkfleet.model.manifest import Manifest, ManifestFile
from sparkfleet.release.image import ImagePin
from sparkfleet.release.lock import Lock, Locking
from sparkfleet.release.plan import plan_hosts
from tests.unit.helpers import host_data
from tests.unit.test_chat_services import CODER, GIB
from tests.unit.test_services import RAG, fake_resolver


def pinned(s) -> tuple[ImagePin, None]:
    """An image resolver that pins each tag to a digest of its name, as a registry would, with no registry."""
    digest = "sha256:" + hashlib.sha256(s.engine_image.encode()).hexdigest()
    return ImagePin(s.engine_image.rsplit(":", 1)[0] + "@" + digest, digest, "registry"), None


def planned(data: dict, resolve=None, resolve_image=pinned):
    return plan_hosts([("spark-a", host_data(**data))], resolve=resolve or fake_resolver(),
                      resolve_image=resolve_image)[0]


# Each inventory's release id and a digest of everything its plan writes (units, engine env, record, plan JSON),
# as planned before chat services could run on an engine and image of their own.
BEFORE = {
    "single": ({}, "7d0bdfdae861", "7a222fe6bf853fa0"),
    "rag": ({"services": RAG}, "fd52eed70d4b", "2782e28c4e891f9f"),
    "coder": ({"kv_cache_memory_bytes": 20 * GIB, "services": {"coder": CODER}}, "520c3c8f7441", "533aae8a4f4648ab"),
    "keyed": ({"api_key": "k" * 20, "engine_env": {"VLLM_LOGGING_LEVEL": "INFO"}, "services": RAG}, "9b50192900d2",
              "15b2818f59ceb395"),
}


@pytest.mark.parametrize("name", BEFORE)
def test_an_inventory_without_a_service_of_its_own_engine_plans_as_before(name):
    data, release_id, digest = BEFORE[name]
    p = planned(data)
    texts = [p.render_unit(), *(p.render_service_unit(s) for s in p.services), p.render_engine_env(),
             json.dumps(p.release_record({}), sort_keys=True), json.dumps(p.to_dict(), sort_keys=True)]
    assert (p.release_id, hashlib.sha256("".join(texts).encode()).hexdigest()[:16]) == (release_id, digest)


# --- a llama.cpp chat model beside the host's vLLM one ---------------------------------------------------------

LLAMA_IMAGE = "registry.sim:5000/ggml-org/llama.cpp:server-cuda-b11669"
GGUF_REPO = "sparkfleet-sim/Tiny-Llama-GGUF"
GGUF_FILES = ["Tiny-Llama-00001-of-00002.gguf", "Tiny-Llama-00002-of-00002.gguf"]
# as the e2e inventory gives it on spark-1 (inventory/sim_engines.py's spark-3, as a service)
LLAMA = {"recipe": "qwen3-8b-gguf", "model_repo": GGUF_REPO, "model_files": GGUF_FILES, "engine_image": LLAMA_IMAGE,
         "llamacpp_version": "11669", "served_model_name": "tiny-llama", "max_model_len": 2048, "api_port": 8004}
# the simulated Spark's own settings that a vLLM stand-in needs and llama.cpp does not
SIM_HOST = {"gpu_memory_utilization": 0.3, "api_host": "0.0.0.0", "api_key": "sim-key-0123456789",
            "sim_engine_knobs": True, "engine_env": {"SIM_TOKENS_PER_S": "50"}}


def gguf_resolver():
    """fake_resolver, but a GGUF repository's files are its .gguf parts (the recipe's config stands in)."""
    others = fake_resolver()

    def resolve(s):
        if not s.model_repo.endswith("GGUF"):
            return others(s)
        files = tuple(ManifestFile(path, 40_000_000, sha256="d" * 64) for path in s.model_files)
        return Manifest("modelscope", s.model_repo, s.model_revision, "f" * 40, files, tuple(s.model_files)), None, None
    return resolve


def llama_host(resolve_image=pinned, **data):
    return planned({**SIM_HOST, "services": {"llama": LLAMA}, **data}, resolve=gguf_resolver(),
                   resolve_image=resolve_image)


def test_a_llama_cpp_chat_service_runs_llama_server_from_its_own_pinned_image():
    host = llama_host()
    [svc] = host.services
    assert (svc.kind, svc.engine.name, svc.image, svc.unit) == ("chat", "llamacpp", LLAMA_IMAGE,
                                                                 "sparkfleet-vllm-llama.service")
    assert svc.engine_args == ["-m", f"{svc.model_dir}/{GGUF_FILES[0]}", "--alias", "tiny-llama", "--host",
                               "127.0.0.1", "--port", "18004", "-c", "2048", "-ngl", "999", "--jinja", "--metrics"]
    assert svc.engine_ref == pinned(svc.settings)[0].ref != host.engine_ref
    unit = host.render_service_unit(svc)
    assert f"    {svc.engine_ref} \\\n" in unit and host.engine_ref not in unit
    assert unit.startswith("# Managed by sparkfleet") and "Description=llama.cpp llama-server: tiny-llama" in unit
    assert svc.docker_options == planned({"services": RAG}).services[0].docker_options[:-2] + [
        "--volume", f"{svc.model_dir}:{svc.model_dir}:ro"]  # the host's engine options, its own model
    assert svc.record()["image"] == svc.engine_ref and svc.identity()["image"] == svc.engine_ref
    # llama-server reads its key from the host's engine.env too; the stand-in's knobs stay the host's
    assert host.render_engine_env().splitlines()[1:] == [
        "VLLM_API_KEY=sim-key-0123456789", "LLAMA_API_KEY=sim-key-0123456789", "SIM_TOKENS_PER_S=50"]


def test_a_llama_cpp_service_asks_the_share_its_context_needs_and_leaves_the_chat_model_alone():
    host = llama_host()
    alone = planned(SIM_HOST, resolve=gguf_resolver())
    share = host.memory_plan["shares"]["llama"]["share"]
    assert 0 < share < 0.1 and host.memory_plan["fits"]  # not the recipe's 0.88 of a whole Spark
    fit = host.services[0].fit(128 * 10**9)
    assert fit.largest_context >= 2048 and fit.kv_memory_bytes - 2048 * fit.kv_bytes_per_token < 13e6
    assert host.render_unit() == alone.render_unit() and host.chat_release_id == alone.chat_release_id
    set_share = llama_host(services={"llama": {**LLAMA, "gpu_memory_utilization": 0.2}})
    assert set_share.memory_plan["shares"]["llama"]["share"] == 0.2


def test_the_lock_holds_both_images_and_a_new_digest_is_a_new_release():
    locking = Locking(Lock(), gguf_resolver(), pinned)
    host = plan_hosts([("spark-a", host_data(**SIM_HOST, services={"llama": LLAMA}))], resolve=locking.model,
                      resolve_image=locking.image)[0]
    assert set(locking.added.images) == {host.settings.engine_image, LLAMA_IMAGE}
    assert locking.added.images[LLAMA_IMAGE].digest == host.services[0].image_pin.digest

    def moved(s):
        pin, _ = pinned(s)
        return (pin, None) if s.engine_image != LLAMA_IMAGE else (ImagePin(pin.ref[:-1] + "0", pin.digest[:-1] + "0",
                                                                            "registry"), None)
    again = llama_host(resolve_image=moved)
    assert again.release_id != host.release_id and again.chat_release_id == host.chat_release_id


def test_an_unpinned_service_image_is_named_by_an_offline_plan():
    svc = plan_hosts([("spark-a", host_data(services={"llama": LLAMA}))])[0].services[0]
    assert (svc.image_pin, svc.engine_ref) == (None, LLAMA_IMAGE)
    assert svc.image_error.startswith(f"engine image {LLAMA_IMAGE}: digest unknown (offline plan)")


def refused(**services) -> list[str]:
    with pytest.raises(SettingsError) as caught:
        llama_host(services=services)
    return caught.value.problems


@pytest.mark.parametrize("entry, expected", [
    ({**LLAMA, "engine_image": "Bad Image;rm"}, "spark-a: setting `services['llama']['engine_image']` is invalid: "
     "must be a Docker image reference"),
    ({**LLAMA, "llamacpp_version": "1 && reboot"}, "spark-a: setting `services['llama']['llamacpp_version']` is "
     "invalid: must be a dotted version"),
    ({**LLAMA, "llamacpp_version": "11670"}, "spark-a: service 'llama': llamacpp_version: "),
    ({**LLAMA, "model_files": ["../../etc/shadow"]}, "spark-a: setting `services['llama']['model_files'][0]` is "
     "invalid: must be a glob of repository file paths"),
    ({**LLAMA, "model_files": "x.gguf"}, "spark-a: setting `services['llama']['model_files']` is invalid: "),
    ({**LLAMA, "engine": "llama"}, "spark-a: setting `services['llama']['engine']` is invalid: Input should be"),
    ({**LLAMA, "engine": "sglang"}, "spark-a: service 'llama' (setting `services`): recipe 'qwen3-8b-gguf' or the "
     "entry runs it on engine 'sglang', which reads no API key from the host's engine.env"),
    ({**LLAMA, "kv_cache_memory_bytes": 2 * GIB}, "llama-server's KV cache is its context: set max_model_len"),
    ({"recipe": "qwen3-embedding-0.6b", "model_files": ["*.gguf"]}, "spark-a: service 'llama' (setting `services`): "
     "`model_files` is only a chat service's (this embedding service runs in the host's vLLM image, on its whole "
     "repository): remove it"),
    ({"recipe": "qwen3-embedding-0.6b", "engine_image": LLAMA_IMAGE}, "`engine_image` is only a chat service's"),
])
def test_a_bad_engine_key_of_a_service_is_refused_in_one_line_with_its_fix(entry, expected):
    problems = refused(llama=entry)
    assert any(p.startswith(expected) or expected in p for p in problems), problems
    assert all("\n" not in p for p in problems)
