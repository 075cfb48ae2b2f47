"""One descriptor per engine (contract/engines.py): the product names an engine only there and in the engine's own
module (sparkfleet/release/engines/), and everything else that knows an engine derives from the descriptor or the
engine's class.

The guard reads every product file under sparkfleet/, files/ and templates/ (and the checkout's deploy files and
defaults): in Python, every identifier (names, attributes, arguments, keywords, definitions, imports) and every
string constant, f-string parts included; elsewhere (templates, shell helpers, Lua) the text less its comments.
An engine is named by any spelling of its name, label, key variable, version setting or image, in any case
("vllm", "VLLM_HOST_IP", "SGLang", "llama.cpp", "llama_cpp", "LLAMA_API_KEY", ...). Docstrings and comments are
prose, not code: they are not read (a docstring may say which engine a rule was measured on). A file's own name
is not read either (the engine unit's template is named after the unit, contract/paths.py UNIT_NAME).

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
from sparkfleet.contract.settings import ADMIN_ENV, Settings, defaults, parse_settings
from sparkfleet.contract.shared import PACKAGE_DIR, envfiles
from sparkfleet.fleet import bench, status
from sparkfleet.controller import progress
from sparkfleet.host.operations import env_command
from sparkfleet.release.engines import ENGINE_CLASSES
from sparkfleet.release.engines.table import table_versions
from tests.unit.helpers import KEY, host_data

ROOT = Path(__file__).resolve().parents[2]

# Where an engine may be named: its descriptor and its behaviour (arguments, docker options, refusals).
OWNERS = ("sparkfleet/contract/engines.py", "sparkfleet/release/engines/")
PRODUCT_DIRS = ("sparkfleet", "files", "templates")
MOST_OUTSIDE = 3  # product files outside the room that may name an engine, at most

# The product files outside the room that name an engine, each with why it must (a path, or a package's directory
# of which one module may): at most MOST_OUTSIDE, each naming one at least.
ALLOWED = {
    "sparkfleet/contract/paths.py": "the engine units' and containers' names on every host (sparkfleet-vllm.service, "
                                    "sparkfleet-vllm-<service>.service, vllm-<service>) predate other engines: a "
                                    "rename would orphan the units and containers hosts run",
    "files/sparkfleet_host": "LEGACY_KEY_VARS: the key variables of a serving file older than `api_key_var`, read on "
                             "the host by the stdlib helpers, which cannot ask the descriptors",
    "sparkfleet/model/topology.py": "EVIDENCE: published two-Spark measurements cite the engine they ran on (the "
                                    "source's facts, not sparkfleet's behaviour)",
}
# Product files outside the three directories: the checkout's deploy files name none; the defaults are data (the
# default engine, its image and container name, each engine's version setting: group_data/all.py, the one home
# of every default).
TOP_FILES = ("deploy.py", "rollback.py")
DEFAULTS = "group_data/all.py"

# Every spelling of an engine: the brief's, and each descriptor's name, label, key variable, version setting and
# image repositories.
_SPELLINGS = ("vllm", "sglang", "llama.cpp", "llama_cpp", "llamacpp", "llama-cpp", "llama-server")
_TERMS = sorted({*_SPELLINGS, *(term.lower() for d in engines.DESCRIPTORS.values()
                                for term in (d.name, d.label, d.key_var, d.version_setting, *d.images) if term)},
                key=len, reverse=True)
ENGINE_TERM = re.compile("|".join(map(re.escape, _TERMS)), re.IGNORECASE)
# Comments of the files that are not Python, by kind: Jinja's {# #} and the unit templates' `#` lines, the console
# templates' Go {{/* */}} and HTML <!-- -->, Lua's `--` lines, and `#` lines elsewhere (shell, systemd).
_HASH_LINE = r"^[ \t]*#[^\n]*"
_COMMENTS = {".j2": rf"\{{#.*?#\}}|{_HASH_LINE}", ".html": r"\{\{-?\s*/\*.*?\*/\s*-?\}\}|<!--.*?-->",
             ".lua": r"^[ \t]*--[^\n]*", ".json": r"(?!)"}


def is_python(path: Path) -> bool:
    return path.suffix == ".py" or path.read_text(errors="replace").startswith("#!/usr/bin/env python")


def product_files() -> list[Path]:
    """The product: every file under sparkfleet/, files/ and templates/ (caches aside), the checkout's deploy files
    and the defaults."""
    found = [p for d in PRODUCT_DIRS for p in sorted((ROOT / d).rglob("*"))
             if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    return [*found, *(ROOT / name for name in TOP_FILES), ROOT / DEFAULTS]


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _words(node: ast.AST, docstrings: set[int]) -> tuple[str, ...]:
    """What a node spells: an identifier it names or defines, or a string constant's text (not a docstring's)."""
    if isinstance(node, ast.Name):
        return (node.id,)
    if isinstance(node, ast.Attribute):
        return (node.attr,)
    if isinstance(node, ast.arg):
        return (node.arg,)
    if isinstance(node, ast.keyword):
        return (node.arg or "",)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return (node.name,)
    if isinstance(node, ast.alias):
        return (node.name, node.asname or "")
    if isinstance(node, ast.ImportFrom):
        return (node.module or "",)
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return tuple(node.names)
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
        return (node.value,)  # f-string parts too: ast.walk reaches each JoinedStr's constants
    return ()


def python_names(source: str) -> list[tuple[int, str]]:
    """(line, text) of each identifier and string constant of Python `source` (docstrings and comments aside) that
    names an engine, in any case."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    return [(getattr(node, "lineno", 0), word) for node in ast.walk(tree) for word in _words(node, skip)
            if ENGINE_TERM.search(word)]


def text_names(text: str, suffix: str) -> list[tuple[int, str]]:
    """(line, line's text) of each line of a file that is not Python that names an engine, its comments (by the
    file's kind, its `suffix`) aside."""
    comments = re.compile(_COMMENTS.get(suffix, _HASH_LINE), re.MULTILINE | re.DOTALL)
    code = comments.sub(lambda match: "\n" * match.group(0).count("\n"), text)
    return [(n, line.strip()) for n, line in enumerate(code.splitlines(), 1) if ENGINE_TERM.search(line)]


def engine_names(path: Path) -> list[tuple[int, str]]:
    if is_python(path):
        return python_names(path.read_text())
    return text_names(path.read_text(errors="replace"), path.suffix)


def allowed_entry(rel: str) -> str | None:
    return next((entry for entry in ALLOWED if rel == entry or rel.startswith(entry + "/")
                 or rel == entry + ".py"), None)


def test_the_finder_sees_identifiers_and_strings_in_any_case_not_docstrings_or_comments():
    source = ('"""A vllm docstring."""\n'
              'A = "vllm"  # vllm in a comment\n'
              'B = f"{x}:VLLM:{y}"\n'
              'C = "vLLM serves it"\n'
              'D = settings.sglang_version\n'
              'E = {"engine": "llama.cpp"}\n'
              'def f(llama_cpp):\n    """sglang here is prose."""\n    return "SGLang:token_usage"\n'
              'from sparkfleet.release.engines.llamacpp import X\n'
              'G = engines.LLAMACPP\n'
              'H = env["VLLM_HOST_IP"], env["LLAMA_API_KEY"], "ggml-org/llama.cpp", "llama-server"\n'
              'I = "a model", "Llama-3.1-8B", "the engine"\n'
              'class SgLangThing:\n    pass\n')
    assert sorted({line for line, _ in python_names(source)}) == [2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 14]
    unit = '{# vllm in a Jinja comment #}\n# vLLM in a unit comment\nExecStart=docker run {{ image }}\nvllm serve\n'
    assert [line for line, _ in text_names(unit, ".j2")] == [4]
    page = '{{/* SGLang in a Go comment\n llama.cpp */}}\n<!-- sglang -->\n<td>{{ $x }}</td>\n<td>VLLM:x</td>\n'
    assert [line for line, _ in text_names(page, ".html")] == [5]
    assert [line for line, _ in text_names("-- llama.cpp in Lua\nlocal e = 'sglang'\n", ".lua")] == [2]
    assert [line for line, _ in text_names("#!/bin/sh\n# vllm\necho ${#x} vllm\n", "")] == [3]


def test_no_product_file_outside_the_room_names_an_engine_but_the_few_allowed():
    """At most MOST_OUTSIDE product files outside release/engines/ and contract/engines.py name an engine in code,
    each listed in ALLOWED with why; the defaults are data; everything else asks the descriptor or the class."""
    assert len(ALLOWED) <= MOST_OUTSIDE
    found, used = [], {}
    for path in product_files():
        rel = str(path.relative_to(ROOT))
        if rel.startswith(OWNERS) or rel == DEFAULTS:
            continue
        names = engine_names(path)
        entry = allowed_entry(rel)
        if names and entry:
            used.setdefault(entry, []).append(rel)
        else:
            found += [f"{rel}:{line}: {value[:100]!r}" for line, value in names]
    assert not found, ("these name an engine in code (an identifier or a string, any case): ask contract/engines.py "
                       "or the engine's class (release/engines/) instead\n" + "\n".join(found))
    assert set(used) == set(ALLOWED), f"allowed files that name no engine any more: {set(ALLOWED) - set(used)}"
    assert all(len(files) == 1 for files in used.values()), f"one file per allowed entry: {used}"
    assert engine_names(ROOT / DEFAULTS)  # the defaults do name the default engine (the check reads them)


def test_the_engines_admin_variables_host_address_and_context_sized_cache_are_the_descriptors():
    """What settings refuse in engine_env, the group's fabric variable and the llama.cpp-style share come from the
    descriptors, so a second engine with the same needs gets them by its descriptor alone."""
    from sparkfleet.release import group

    assert ADMIN_ENV == {var: why for d in engines.DESCRIPTORS.values() for var, why in d.admin_env} and ADMIN_ENV
    for d in engines.able("tensor_parallel"):
        assert d.host_ip_var and d.host_ip_var in group.FABRIC_ENV
    members = group.TensorParallelGroup(("a", "b"), ("10.0.0.1", "10.0.0.2"), "enp1", 9000, 6379)
    assert {var: members.env("b")[var] for var in engines.HOST_IP_VARS} == dict.fromkeys(engines.HOST_IP_VARS,
                                                                                            "10.0.0.2")
    assert [d.name for d in engines.DESCRIPTORS.values() if d.kv_cache_is_context] == [
        d.name for d in engines.serving_format("gguf")]  # today: the GGUF engine, whose cache is its -c
    pooling = ENGINE_CLASSES[engines.POOLING_ENGINE]
    assert pooling.descriptor.pooling and set(pooling.pooling_args) == {"embedding", "reranker"}
    assert all(not e.pooling_args for e in ENGINE_CLASSES.values() if not e.descriptor.pooling)


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
    assert envfiles.engine_api_key(env, envfiles.serving_key_vars(written)) == (KEY if d.key_var else None)


def test_the_helpers_read_the_key_the_serving_file_names_and_an_older_file_the_legacy_names():
    env = {"VLLM_API_KEY": "sk-v", "LLAMA_API_KEY": "sk-l"}
    assert envfiles.serving_key_vars({"api_key_var": "LLAMA_API_KEY"}) == ("LLAMA_API_KEY",)
    assert envfiles.engine_api_key(env, envfiles.serving_key_vars({"api_key_var": None})) is None
    assert envfiles.serving_key_vars({"api_key_var": "A=B"}) == ()  # not a variable name: none
    assert envfiles.serving_key_vars({}) == envfiles.LEGACY_KEY_VARS  # before api_key_var
    assert envfiles.engine_api_key({"LLAMA_API_KEY": "sk-l"}, envfiles.serving_key_vars({})) == "sk-l"


def test_the_rollbacks_edit_takes_the_key_variable_from_the_serving_file(tmp_path):
    live, kept, serving_file = tmp_path / "engine.env", tmp_path / "kept.env", tmp_path / "serving.json"
    live.write_text(f"# h\nLLAMA_API_KEY={KEY}\nHF_HUB_OFFLINE=1\n")
    serving_file.write_text(json.dumps({"api_key_var": "LLAMA_API_KEY", "probes": {}}))
    for action in ("env-keep", "env-restore"):
        subprocess.run([sys.executable, str(PACKAGE_DIR), action, str(live), str(kept), "", str(serving_file)],
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
