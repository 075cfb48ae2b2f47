"""One descriptor per engine (contract/engines.py): the product names an engine only there and in the engine's own
module (sparkfleet/release/engines/), and everything else that knows an engine derives from the descriptor.

Adding an engine: docs/development.md, "Adding an engine"."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sparkfleet.contract import engines, formats, paths, serving
from sparkfleet.contract.recipes import IMAGES, VERSION_SETTING
from sparkfleet.contract.settings import Settings, defaults, parse_settings
from sparkfleet.contract.shared import MODULE_FILE, host_module
from sparkfleet.fleet import bench, status
from sparkfleet.controller import progress
from sparkfleet.host.operations import env_command
from sparkfleet.release.engines import ENGINE_CLASSES
from sparkfleet.release.engines.table import table_versions
from tests.unit.helpers import KEY, host_data

ROOT = Path(__file__).resolve().parents[2]

# Where an engine may be named: its descriptor and its behaviour (arguments, docker options, refusals).
OWNERS = ("sparkfleet/contract/engines.py", "sparkfleet/release/engines/")

# Strings that name an engine without being its identity, each with why it stays (file, the exact string).
ALLOWED = {
    # The chat unit keeps its historic name whatever the engine (hosts run it; a rename would orphan their units),
    # and the RAG services (pooling models: always the pooling engine) keep theirs: host names, one owner.
    ("sparkfleet/contract/paths.py", "sparkfleet-vllm.service"): "the chat engine's unit name on every host",
    ("sparkfleet/contract/paths.py", r"sparkfleet-vllm-([a-z][a-z0-9-]{0,30})\.service"): "a service's unit",
    ("sparkfleet/contract/paths.py", "sparkfleet-vllm-"): "a service's unit (service_unit)",
    ("sparkfleet/contract/paths.py", "vllm-"): "a service's container (service_container)",
    # The chat unit's template, named after that unit (one template for every engine).
    ("sparkfleet/release/render.py", "sparkfleet-vllm.service.j2"): "the unit template's file name",
    # The defaults' one home: the default engine, its image, and the engine container's fixed name (hosts run it).
    ("group_data/all.py", "vllm"): "the default `engine` and the fixed `container_name`",
    ("group_data/all.py", "vllm/vllm-openai:v0.33.0"): "the default `engine_image`",
    ("group_data/all.py", "NCCL over RoCE between two Sparks broken (eugr/spark-vllm-docker #392)"):
        "a refused kernel's reason, citing a project's issue tracker",
    # A serving file written before `api_key_var` (an older converge): the key under the names of that time.
    ("files/sparkfleet_host.py", "VLLM_API_KEY"): "LEGACY_KEY_VARS: a serving file older than api_key_var",
    ("files/sparkfleet_host.py", "LLAMA_API_KEY"): "LEGACY_KEY_VARS: a serving file older than api_key_var",
}

_NAME = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(map(re.escape, engines.ENGINES)) + r")(?![A-Za-z0-9_])")
_SETTINGS_AND_KEYS = tuple({*engines.VERSION_SETTINGS, *engines.KEY_VARS, *host_module.LEGACY_KEY_VARS})


def product_files() -> list[Path]:
    """The product's Python: the package, the defaults, the top-level deploy files and the host helpers."""
    helpers = [p for p in sorted((ROOT / "files").iterdir()) if p.is_file() and (
        p.suffix == ".py" or p.read_text(errors="replace").startswith("#!/usr/bin/env python"))]
    return [*sorted((ROOT / "sparkfleet").rglob("*.py")), ROOT / "group_data" / "all.py", ROOT / "deploy.py",
            ROOT / "rollback.py", *helpers]


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def engine_names(source: str) -> list[tuple[int, str]]:
    """(line, string) of each string constant of `source` (docstrings and comments aside) that names an engine
    (its name as a word: "vllm", a `vllm:` series, "sparkfleet-vllm.service"), its version setting or an API key
    variable."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
            and (_NAME.search(node.value) or any(name in node.value for name in _SETTINGS_AND_KEYS))]


def test_the_finder_sees_identities_not_prose_docstrings_or_comments():
    source = ('"""A vllm docstring."""\n'
              'A = "vllm"  # vllm in a comment\n'
              'B = f"vllm:{x}_total"\n'
              'C = "vLLM serves it, with VLLM_SERVER_DEV_MODE off"\n'
              'D = "the setting vllm_version"\n'
              'E = {"engine": "llamacpp"}\n'
              'def f():\n    """sglang here is prose."""\n    return "sglang:token_usage"\n')
    assert sorted(line for line, _ in engine_names(source)) == [2, 3, 5, 6, 9]


def test_only_the_descriptor_and_the_engines_modules_name_an_engine():
    found, used = [], set()
    for path in product_files():
        rel = str(path.relative_to(ROOT))
        if rel.startswith(OWNERS):
            continue
        for line, value in engine_names(path.read_text()):
            if (rel, value) in ALLOWED:
                used.add((rel, value))
            else:
                found.append(f"{rel}:{line}: {value!r}")
    assert not found, ("these name an engine, a `vllm:` series, a version setting or a key variable: ask "
                       "contract/engines.py instead (or allow-list a name that is not an engine's identity)\n"
                       + "\n".join(found))
    assert used == set(ALLOWED), f"allow-list entries nothing uses any more: {set(ALLOWED) - used}"


@pytest.mark.parametrize("name", engines.ENGINES)
def test_each_descriptor_has_its_behaviour_setting_default_flag_table_and_image(name):
    d, engine = engines.descriptor(name), ENGINE_CLASSES[name]
    assert engine.descriptor is d and (engine.name, engine.label, engine.key_var) == (d.name, d.label, d.key_var)
    assert d.version_setting in Settings.model_fields and d.version_setting in defaults()
    assert defaults()[d.version_setting] in table_versions(name)  # the default version has its flag table
    assert engine.image.rsplit(":", 1)[0] == d.images[0]  # the image a refusal names is its project's
    assert (VERSION_SETTING[name], IMAGES[name]) == (d.version_setting, d.images)  # the recipes' tables
    assert d.model_format in ("safetensors", "gguf") and d.metrics.running and d.metrics.waiting
    assert all(phase.key and phase.label for phase in d.start_phases)


def test_the_settings_engine_names_are_the_descriptors():
    assert tuple(ENGINE_CLASSES) == engines.ENGINES
    assert parse_settings("a", host_data(engine="llamacpp", engine_image=ENGINE_CLASSES["llamacpp"].image)).engine
    with pytest.raises(Exception, match="'vllm', 'sglang' or 'llamacpp'"):
        parse_settings("a", host_data(engine="tensorrt"))


@pytest.mark.parametrize("name", engines.ENGINES)
def test_each_engines_env_file_carries_only_the_key_it_reads(name):
    """SGLang reads no key variable (it would log --api-key): its env file carries none; the others carry theirs
    alone, and the serving file names it for the helpers (health, watchdog), status and the rollback's edit."""
    d = engines.descriptor(name)
    text = formats.engine_env(KEY, {"X": "1"}, d.key_var)
    env = formats.parse_env(text)
    assert {var for var in env if var in formats.API_KEY_VARS} == ({d.key_var} if d.key_var else set())
    assert (KEY in text) == bool(d.key_var)
    settings = parse_settings("a", host_data(engine=name, engine_image=ENGINE_CLASSES[name].image))
    written = json.loads(serving.serving_file(settings))
    assert written["api_key_var"] == d.key_var
    assert host_module.engine_api_key(env, host_module.serving_key_vars(written)) == (KEY if d.key_var else None)


def test_the_helpers_read_the_key_the_serving_file_names_and_an_older_file_the_legacy_names():
    env = {"VLLM_API_KEY": "sk-v", "LLAMA_API_KEY": "sk-l"}
    assert host_module.serving_key_vars({"api_key_var": "LLAMA_API_KEY"}) == ("LLAMA_API_KEY",)
    assert host_module.engine_api_key(env, host_module.serving_key_vars({"api_key_var": None})) is None
    assert host_module.serving_key_vars({"api_key_var": "A=B"}) == ()  # not a variable name: none
    assert host_module.serving_key_vars({}) == host_module.LEGACY_KEY_VARS  # before api_key_var
    assert host_module.engine_api_key({"LLAMA_API_KEY": "sk-l"}, host_module.serving_key_vars({})) == "sk-l"


def test_the_rollbacks_edit_takes_the_key_variable_from_the_serving_file(tmp_path):
    live, kept, serving_file = tmp_path / "engine.env", tmp_path / "kept.env", tmp_path / "serving.json"
    live.write_text(f"# h\nLLAMA_API_KEY={KEY}\nHF_HUB_OFFLINE=1\n")
    serving_file.write_text(json.dumps({"api_key_var": "LLAMA_API_KEY", "probes": {}}))
    for action in ("env-keep", "env-restore"):
        subprocess.run([sys.executable, str(MODULE_FILE), action, str(live), str(kept), "", str(serving_file)],
                       check=True, timeout=30)
        assert KEY not in kept.read_text() and "LLAMA_API_KEY" not in kept.read_text()
    assert f"LLAMA_API_KEY={KEY}" in live.read_text().splitlines()  # today's key, under the engine's name
    assert env_command("env-keep").split()[-1] == env_command("env-restore").split()[-1] == paths.SERVING_FILE


@pytest.mark.parametrize("name", engines.ENGINES)
def test_status_reads_each_engines_series_with_the_key_only_where_it_guards_them(name):
    d = engines.descriptor(name)
    asked = {}

    class Host:
        def get_fact(self, fact, **kw):
            asked[fact.__name__] = kw
            return {"serving": True} if fact.__name__ == "ServiceProbe" else f"{d.metrics.running} 2\n"

    s = parse_settings("a", host_data(engine=name, engine_image=ENGINE_CLASSES[name].image))
    found = status.engine_on_host(Host(), s)
    assert found["metrics"] == {d.metrics.running: 2.0} and asked["EngineMetrics"]["names"] == status.load_series(name)
    assert asked["EngineMetrics"].get("key_var") == (d.key_var if d.metrics_need_key else None)


@pytest.mark.parametrize("name", engines.ENGINES)
def test_bench_reads_each_engines_counters(name):
    d = engines.descriptor(name)
    assert bench.counters_of(name) == d.bench and bench.engine_of(f"{d.metrics.running} 1\n") == name
    if d.bench.prefix_hits:
        text = f"{d.bench.prefix_hits[0]} 40\n{d.bench.prefix_queries[0]} 100\n"
        assert bench.parse_prefix_cache(text, d.bench)["hit_rate"] == 0.4


@pytest.mark.parametrize("name", engines.ENGINES)
def test_progress_shows_each_engines_start_phases_under_their_own_label(name):
    """Every engine's fixed start lines are recognised, and none is taken for another engine's phase."""
    for phase in engines.descriptor(name).start_phases:
        if phase.pattern:
            continue
        seen = progress.phase_of(f"INFO 12-03 10:00:00 {phase.key} ...")
        assert seen and (seen.label, seen.ready, seen.failed) == (phase.label, phase.ready, phase.failed), phase


def test_capabilities_choose_the_refusals_and_the_advice():
    tp = [d.name for d in engines.able("tensor_parallel")]
    assert tp and all(ENGINE_CLASSES[n].descriptor.tensor_parallel for n in tp)
    assert engines.names(engines.serving_format("gguf")) == " or ".join(
        f'engine = "{d.name}"' for d in engines.DESCRIPTORS.values() if d.model_format == "gguf")
    assert engines.kv_usage_series()[:2] == (engines.VLLM.metrics.kv_usage, *engines.VLLM.legacy_kv_usage)


@pytest.mark.parametrize(("line", "shown"), [
    ("[2026-09-22 19:51:23] Load weight begin. avail mem=113.93 GB", "loading model"),  # SGLang
    ("[2026-09-22 19:53:22] Load weight end. elapsed=118.38 s, type=Qwen3_5ForConditionalGeneration", "weights loaded"),
    ("The server is fired up and ready to roll!", "ready"),
    ("srv    load_model: loading model '/models/m/m-Q4_K_M.gguf'", "loading model"),  # llama-server
    ("main: model loaded", "weights loaded"),
    ("main: server is listening on http://127.0.0.1:18000 - starting the main loop", "ready"),
    ("E srv  llama_server: exiting due to model loading error", "failed to start"),
])
def test_progress_reads_sglang_and_llama_server_start_lines(line, shown):
    assert progress.phase_of(line).text() == shown
