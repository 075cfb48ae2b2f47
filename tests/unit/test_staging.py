"""A rollout's staging (`sparkfleet.tasks.stage`): the operations it sends, recorded without a host. It fetches and
verifies the new release's model files and checks its engine image, and writes nothing a running engine reads (the
model stage, which a converge runs, writes the serving file: the same recorder sees it)."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from sparkfleet.contract import paths
from sparkfleet.release.image import ImagePin
from sparkfleet.release.plan import plan_hosts
from tests.unit.helpers import host_data

# the modules, not the stage functions that `sparkfleet.tasks` names alike
model_module, service_module, staging_module = (importlib.import_module(f"sparkfleet.tasks.{name}")
                                                for name in ("model", "service", "staging"))

ENGINE_REF = "vllm/vllm-openai@sha256:" + "c" * 64
# what the running release reads: a staging that writes one of these changes a serving host
RUNNING = {paths.UNIT_PATH, paths.RAY_UNIT_PATH, paths.ENGINE_ENV, paths.RELEASE_FILE, paths.SERVING_FILE,
           paths.MEMORY_PLAN}


@pytest.fixture
def sent(monkeypatch):
    """Every operation the model and service modules call, as (operation, its keyword arguments)."""
    calls = []

    def recorder(kind):
        def op(**kwargs):
            calls.append((kind, kwargs))
            return SimpleNamespace(will_change=False, did_change=lambda: False)
        return op

    for module, names in ((model_module, ("managed_file", "managed_files", "managed_absent", "managed_directory",
                                          "managed_user", "managed_permissions", "managed_unit", "secret_file",
                                          "runtime_bundle", "model_verified")),
                          (service_module, ("image_pinned",))):
        for name in names:
            monkeypatch.setattr(module, name, recorder(name))
    monkeypatch.setattr(model_module, "fleet_token", lambda: "t" * 32)
    return calls


def staged_plan(**settings):
    pin = ImagePin(ENGINE_REF, ENGINE_REF.rpartition("@")[2], "registry")
    return plan_hosts([("spark-a", host_data(**settings))], resolve_image=lambda s: (pin, None))[0]


PREPARED = SimpleNamespace(bundle=SimpleNamespace(path=Path("/cache/runtime-aarch64.tar.gz"), sha256="0" * 64),
                           model_copy=None)
FACTS = SimpleNamespace(model_files={"record": {}, "files": {}})


@pytest.mark.parametrize("source", ["peer", "hub"])
def test_staging_fetches_the_model_and_checks_the_image_and_writes_nothing_the_running_release_reads(sent, source):
    plan = staged_plan(model_source=source)
    staging_module.staging.__wrapped__(plan, FACTS, PREPARED)
    written = {kwargs.get("dest") for _, kwargs in sent} - {None}
    written |= {dest for _, kwargs in sent for _, dest, _ in kwargs.get("files", ())}
    assert f"{paths.BIN_DIR}/sparkfleet-fetch" in written  # the helpers it fetches with
    assert written & RUNNING == set()
    assert [k["model_dir"] for op, k in sent if op == "model_verified"] == [plan.model_dir]
    assert [k["ref"] for op, k in sent if op == "image_pinned"] == [ENGINE_REF]
    # the only unit it touches is the peer share's (the peers fetch the new files from it)
    assert [k["service"] for op, k in sent if op == "managed_unit"] == \
        ([paths.SHARE_UNIT_NAME] if source == "peer" else [])


def test_the_model_stage_of_a_converge_writes_the_serving_file_the_staging_leaves(sent):
    model_module.model.__wrapped__(staged_plan(model_source="hub"), FACTS, PREPARED)
    assert paths.SERVING_FILE in {kwargs.get("dest") for _, kwargs in sent}
