"""A chat service on its own engine and image: a llama.cpp model beside a host's vLLM one, planned with
llama-server's arguments, its own image pinned by digest (the lock holds both images) and run by its unit; and
every inventory without such a service plans exactly the releases, units and files it planned before."""

from __future__ import annotations

import hashlib
import json

import pytest

from sparkfleet.release.image import ImagePin
from sparkfleet.release.plan import plan_hosts
from tests.unit.helpers import host_data
from tests.unit.test_chat_services import CODER, GIB
from tests.unit.test_services import RAG, fake_resolver


def pinned(s) -> tuple[ImagePin, None]:
    """An image resolver that pins each tag to a digest of its name, as a registry would, with no registry."""
    digest = "sha256:" + hashlib.sha256(s.engine_image.encode()).hexdigest()
    return ImagePin(s.engine_image.split(":")[0] + "@" + digest, digest, "registry"), None


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
