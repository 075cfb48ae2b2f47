"""Models beside the host's chat model, each in its own engine unit and port: RAG services (pooling models:
embeddings, rerank) and other chat models.

A host's `services` setting names each service and its recipe (recipes/<name>.toml, kind "embedding",
"reranker" or "chat"); an entry's keys override the recipe's [settings]. A chat service is a release of its
own, planned like the host's chat model from the defaults, its recipe and the entry (never the host's own
model's parsers or flags), in the host's engine and image unless its recipe or entry names another (a llama.cpp
model beside a vLLM one: its own image, pinned like the host's). Everything here is pure planning: the merged
settings, the engine arguments, the fit of each service in its share, and ONE memory plan per host: the chat
model's and every service's gpu_memory_utilization must sum within gpu_memory_budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from pydantic import ValidationError

from sparkfleet.contract import engines, formats, paths, serving
from sparkfleet.contract.formats import host_memory_bytes
from sparkfleet.model.config import config_problem, model_shape
from sparkfleet.model.fit import GIB, FitReport, check_fit, fit_report, fixed_kv_share
from sparkfleet.model.manifest import Manifest, model_dir
from sparkfleet.contract.recipes import MODEL_SPECIFIC, Recipe, catalogue, recipe
from sparkfleet.model.fit import RESERVE_BYTES
from sparkfleet.release.engines import (ENGINE_CLASSES, Engine, engine_for, gguf_entry, is_gguf_model,
                                        surface_problems)
from sparkfleet.release.image import ImagePin
from sparkfleet.contract.settings import Service, Settings, SettingsError, defaults, recipe_settings

# The engine a RAG service (a pooling model: embeddings, rerank) runs on, and the kinds it serves (its class's
# pooling_args: release/engines/).
POOLING = ENGINE_CLASSES[engines.POOLING_ENGINE]
KINDS = tuple(POOLING.pooling_args)
CHAT = "chat"
SERVICE_KINDS = (*KINDS, CHAT)
# A chat service's own keys: what any chat recipe or an entry sets about its model, reset to the defaults before
# its recipe applies, so none of the host's own model's parsers, limits or flags reach it. The engine, its image and
# version are the host's unless the recipe's engine differs or the entry names them; the fleet's settings (keys,
# ports of the host, paths, watchdog) are the host's.
HOST_ENGINE_KEYS = ("engine", "engine_image", *engines.VERSION_SETTINGS)
# A pooling service runs in the host's image (the pooling engine's) on its whole repository: these keys are a chat
# service's only.
CHAT_ONLY_KEYS = (*HOST_ENGINE_KEYS, "model_files")
# The engines a chat service may run on: those that read the API key from the host's engine.env (the descriptor's
# key_var), which the service's container shares. SGLang reads none (release/engines/sglang.py).
SERVICE_ENGINES = tuple(d.name for d in engines.DESCRIPTORS.values() if d.key_var)
# A 0.6B pooling model's activations and CUDA graphs take far less than the chat model's 3 GiB reserve.
SERVICE_RESERVE_BYTES = 1 * GIB
# The request each health gate and probe sends: served under /v1, where vLLM's API key applies (vLLM's
# middleware guards /v1 paths only: /rerank and /score answer without the key).
REQUIRED = ("model_repo", "model_revision", "served_model_name", "api_port", "gpu_memory_utilization")


_T = TypeVar("_T")


def _required(value: _T | None) -> _T:
    """A REQUIRED key of a merged service (merged refuses an entry without it), or a chat service's own settings."""
    assert value is not None, "a merged service's required key, or a chat service's settings"
    return value


def container_name(name: str) -> str:
    return paths.service_container(name)


@dataclass
class ServicePlan:
    """One service of one host: its merged settings, model, engine arguments and fit."""

    name: str
    recipe: Recipe
    service: Service  # the recipe's settings under the entry's: every REQUIRED key set
    model_root: str
    manifest: Manifest | None = None
    config: dict | None = None
    hub_error: str | None = None
    engine_args: list[str] = field(default_factory=list)
    docker_options: list[str] = field(default_factory=list)
    settings: Settings | None = None  # a chat service's own settings (its release's), None for a pooling one
    image: str | None = None  # its own engine_image (another than the host's); None: it runs the host's image
    image_pin: ImagePin | None = None  # that image pinned by content; None: unknown (image_error says why)
    image_error: str | None = None

    @property
    def engine_ref(self) -> str | None:
        """What its unit runs when its image is its own: the pinned reference, the tag only in a plan that could
        not pin it (deploy refuses such a plan); None: the host's image (HostPlan.engine_ref)."""
        return self.image_pin.ref if self.image_pin else self.image

    @property
    def kind(self) -> str:
        return self.recipe.kind

    @property
    def engine(self) -> Engine:
        """Its engine (release/engines/): a chat service's own, the pooling engine for a pooling model."""
        return ENGINE_CLASSES[self.settings.engine] if self.settings else POOLING

    @property
    def reserve_bytes(self) -> int:
        """What the engine holds beside its weights and KV cache: a chat model's activations and CUDA graphs,
        or a small pooling model's."""
        return RESERVE_BYTES if self.kind == CHAT else SERVICE_RESERVE_BYTES

    @property
    def unit(self) -> str:
        return paths.service_unit(self.name)

    @property
    def on_demand(self) -> bool:
        return self.service.on_demand

    @property
    def socket(self) -> str:
        """An on-demand service's socket unit (systemd listens for it: paths.ON_DEMAND_HOST)."""
        return paths.on_demand_socket(self.name)

    @property
    def proxy(self) -> str:
        """An on-demand service's proxy unit (the socket starts it; it requires the engine's unit)."""
        return paths.on_demand_proxy(self.name)

    @property
    def container(self) -> str:
        return container_name(self.name)

    @property
    def model_dir(self) -> str:
        return model_dir(self.model_root, _required(self.service.model_repo), self.manifest)

    @property
    def weight_bytes(self) -> int:
        """The manifest's exact weight bytes (Manifest.weight_bytes) when the hub answered, else the recipe's."""
        if self.manifest:
            return self.manifest.weight_bytes
        return self.recipe.model.weight_bytes

    def fit(self, memory_bytes: int) -> FitReport:
        config = self.config or self.recipe.model.config
        max_len = self.service.max_model_len or model_shape(config).max_position_embeddings
        return fit_report(config, self.weight_bytes, memory_bytes=memory_bytes,
                          gpu_memory_utilization=_required(self.service.gpu_memory_utilization),
                          max_model_len=max_len,
                          kv_cache_dtype=self.settings.kv_cache_dtype if self.settings else "auto",
                          reserve_bytes=self.reserve_bytes)

    def identity(self) -> dict:
        """What makes this service's part of the release: same inputs, same release id."""
        return {"name": self.name, "model": [self.manifest.hub, self.manifest.repo, self.manifest.pin,
                                             self.manifest.digest] if self.manifest else None,
                "args": self.engine_args, "docker": self.docker_options,
                **({"image": self.engine_ref} if self.image else {}),  # its digest: a new one is a new release
                **({"on_demand": True} if self.on_demand else {})}

    def record(self) -> dict:
        """This service in /etc/sparkfleet/release.json: what status, testinfra and a rollback read."""
        return {"kind": self.kind, "recipe": self.recipe.name, "unit": self.unit, "container": self.container,
                "model_dir": self.model_dir, "manifest": self.manifest.summary() if self.manifest else None,
                "served_model_name": self.service.served_model_name, "api_port": self.service.api_port,
                "endpoint": serving.REQUESTS[self.kind]["path"],  # what the probe asks: contract/serving.py
                "gpu_memory_utilization": self.service.gpu_memory_utilization, "engine_args": self.engine_args,
                **({"engine": self.settings.engine, "image": self.engine_ref} if self.image and self.settings
                   else {}),
                **({"on_demand": {"socket": self.socket, "proxy": self.proxy}} if self.on_demand else {})}


def model_keys() -> set[str]:
    """Every key a chat recipe or a service entry sets about its model (MODEL_SPECIFIC, each chat recipe's
    [settings], the entry's), less the host's engine keys."""
    keys = {*MODEL_SPECIFIC, *Service.model_fields, "model_files", "max_num_seqs", "kv_cache_dtype",
            *(key for r in catalogue().values() if r.kind == CHAT for key in r.settings)}
    return keys - set(HOST_ENGINE_KEYS) - {"recipe", "hf_overrides", "on_demand_idle_s"}  # the last: the host's


def engine_layer(s: Settings, engine: str, chosen: Recipe, recipe_keys: dict) -> dict:
    """A chat service's engine keys under its entry's: none on the host's engine (its image and version stay the
    host's); on another, that engine's image and the recipe's engine keys, and no image archive (the host's archive
    holds the host's image)."""
    if engine == s.engine:
        return {}
    same = chosen.engine == engine  # the recipe's image and version are its engine's only
    own = {key: value for key, value in recipe_keys.items() if key in HOST_ENGINE_KEYS and same}
    return {"engine": engine, "engine_image": ENGINE_CLASSES[engine].image, **own}


def chat_settings(where: str, s: Settings, chosen: Recipe, entry: Service) -> tuple[Settings | None, list[str]]:
    """A chat service's own settings: the host's, with every model key at its default, then the recipe's
    (parse_settings' own precedence), then the entry's. Its engine, image and version are the host's unless its
    recipe's engine differs (a llama.cpp model beside a vLLM one: then the recipe's) or the entry names them."""
    engine = entry.engine or chosen.engine
    if engine not in SERVICE_ENGINES:
        return None, [f"{where}: recipe {chosen.name!r} or the entry runs it on engine {engine!r}, which reads no API "
                      f"key from the host's engine.env: a chat service runs on "
                      f"{engines.names(tuple(map(engines.descriptor, SERVICE_ENGINES)))}: choose such a recipe or "
                      f"`engine`, or give the model a host of its own"]
    if engine != s.engine and (s.tensor_parallel_hosts or s.tensor_parallel_size > 1):
        return None, [f"{where}: engine {engine!r} beside a tensor-parallel model: the group's GPUs serve its one "
                      f"engine: give the model a host outside tensor_parallel_hosts, or use engine {s.engine!r}"]
    if entry.hf_overrides:
        return None, [f"{where}: hf_overrides is a pooling service's key (a chat model takes its config as the "
                      f"hub has it): remove it"]
    keys = model_keys()
    own = entry.model_dump(exclude_unset=True, exclude={"recipe", "hf_overrides", "on_demand"})
    try:
        chosen_settings = recipe_settings(where, chosen.name, own.get("model_repo"))
    except SettingsError as exc:
        return None, exc.problems
    layers = [{key: value for key, value in s.model_dump().items() if key not in keys},
              {key: value for key, value in defaults().items() if key in keys},
              {key: value for key, value in chosen_settings.items() if key not in HOST_ENGINE_KEYS},
              engine_layer(s, engine, chosen, chosen_settings), own, {"recipe": chosen.name, "services": {}}]
    merged_layers = {key: value for layer in layers for key, value in layer.items()}
    if merged_layers["engine_image"] != s.engine_image:  # the host's archive holds the host's image, not this one
        merged_layers["engine_image_archive"] = None
    try:
        return Settings(**merged_layers), []
    except ValidationError as exc:
        return None, [f"{where}: `{'.'.join(map(str, err['loc']))}` from recipe {chosen.name!r} or the entry is "
                      f"invalid: {err['msg']}" for err in exc.errors()]


def merged(host: str, name: str, s: Settings) -> tuple[Recipe | None, Service | None, list[str],
                                                       Settings | None]:
    """(recipe, the entry over the recipe's settings, problems, a chat service's own settings) of one service."""
    entry = s.services[name]
    where = f"{host}: service {name!r} (setting `services`)"
    try:
        chosen = recipe(entry.recipe)
    except ValueError as exc:
        return None, None, [f"{where}: {exc}"], None
    if chosen.kind not in SERVICE_KINDS:
        return None, None, [f"{where}: recipe {chosen.name!r} is a {chosen.kind} recipe; a service serves "
                            f"one of kind {' or '.join(SERVICE_KINDS)}"], None
    chat_only = [key for key in CHAT_ONLY_KEYS if key in entry.model_fields_set]
    if chosen.kind != CHAT and chat_only:
        keys = f"{', '.join(f'`{k}`' for k in chat_only)} {'are' if len(chat_only) > 1 else 'is'}"
        return None, None, [f"{where}: {keys} only a chat service's (this {chosen.kind} service runs in the host's "
                            f"{POOLING.label} image, on its whole repository): remove "
                            f"{'them' if len(chat_only) > 1 else 'it'}"
                            ], None
    own = None
    if chosen.kind == CHAT:
        own, found = chat_settings(where, s, chosen, entry)
        if not own:
            return None, None, found, None
        if entry.api_port is None:
            return None, None, [f"{where}: set `api_port` (a chat recipe has none: the host's is its own "
                                f"model's)"], None
    fields = ({key: getattr(own, key) for key in Service.model_fields if key in Settings.model_fields}
              if own else chosen.settings)
    try:
        service = Service(**{**fields, **entry.model_dump(exclude_unset=True), "recipe": chosen.name})
    except ValidationError as exc:
        return None, None, [f"{where}: `{'.'.join(map(str, err['loc']))}` from recipe {chosen.name!r} or the "
                            f"entry is invalid: {err['msg']}" for err in exc.errors()], None
    if entry.on_demand_idle_s is not None and not service.on_demand:
        return None, None, [f"{where}: on_demand_idle_s is set but the service is always on: set `on_demand` "
                            f"to true, or remove on_demand_idle_s"], None
    missing = [key for key in REQUIRED if getattr(service, key) is None]
    if missing:
        return None, None, [f"{where}: set {', '.join(f'`{k}`' for k in missing)} (recipe {chosen.name!r} "
                            f"does not)"], None
    return chosen, service, [], own


def args_problems(where: str, s: Settings, service: Service, args: list[str]) -> list[str]:
    """Every flag checked against the pinned pooling engine's table; no flag a service setting owns in
    extra_engine_args, none that carries a secret or opens an admin surface, --trust-remote-code only where its
    recipe and the user both say so."""
    remote_code = (recipe(service.recipe).trust_remote_code, s.allow_trust_remote_code)
    problems = [f"{where}: extra_engine_args: {p}" for p in surface_problems(
        service.extra_engine_args, remote_code, POOLING.admin_flags, POOLING.flag_name)]
    try:
        table = POOLING.flag_table(POOLING.version(s))
    except ValueError:
        return problems  # the chat model's check already names the missing table
    problems += [f"{where}: {p}" for p in table.problems(args)]
    for arg in service.extra_engine_args:
        if not arg.startswith("-"):
            continue
        flag = arg.split("=", 1)[0]
        dest = table.flags.get(flag, {}).get("dest")
        named = POOLING.flag_name(flag)  # as the engine reads it (vLLM: --api_key is --api-key)
        if named in POOLING.secret_flags:
            problems.append(f"{where}: extra_engine_args: `{flag}` would put a secret in the world-readable unit: "
                            f"{POOLING.secret_flags[named]}")
        elif dest in POOLING.service_dests:
            problems.append(f"{where}: extra_engine_args: `{flag}` is set by sparkfleet from "
                            f"{POOLING.service_dests[dest]}: set that key of the service instead")

    def refused(flag: str) -> bool:  # named above already
        named = POOLING.flag_name(flag)
        return (named in POOLING.secret_flags or named in POOLING.admin_flags
                or table.flags[flag].get("dest") in POOLING.service_dests)
    return problems + [f"{where}: extra_engine_args: {p}" for p in table.unreviewed(service.extra_engine_args, refused)]


def sized_by(refusal: str, kv_fixed: bool) -> str:
    """The fit's refusal naming the setting that sizes the cache: a fixed cache grows with kv_cache_memory_bytes
    (its share follows), not with gpu_memory_utilization."""
    return refusal.replace("raise gpu_memory_utilization", "raise kv_cache_memory_bytes") if kv_fixed else refusal


def kv_too_big(where: str, kv_bytes: int, weights_bytes: int, share: float) -> str:
    """The refusal of a fixed KV cache that, with its model's weights and reserve, is more than the host."""
    return (f"{where}: kv_cache_memory_bytes {kv_bytes:,} beside the weights ({weights_bytes / 1e9:.1f} GB) and the "
            f"reserve needs {share:g} of the host's memory (host_memory_gb): lower kv_cache_memory_bytes")


def min_share(report: FitReport) -> float:
    """The smallest gpu_memory_utilization (in hundredths) that holds the weights, the reserve and one
    sequence of max_model_len."""
    need = report.weights_bytes + report.reserve_bytes + report.max_model_len * report.kv_bytes_per_token
    return math.ceil(need / report.memory_bytes * 100) / 100


def memory_plan(s: Settings, services: dict[str, Service]) -> dict:
    """The host's one memory plan (contract/formats.py): the chat's share and each service's, by unit, in the
    order they start (the chat model first; each waits for the one before to answer, up to health_timeout_s)."""
    rows = {"chat": (paths.UNIT_NAME, s.gpu_memory_utilization, paths.engine_port(s.api_port)),
            **{name: (paths.service_unit(name), _required(svc.gpu_memory_utilization),
                      paths.engine_port(_required(svc.api_port)))
               for name, svc in services.items()}}
    return formats.memory_plan(s.gpu_memory_budget, host_memory_bytes(s.host_memory_gb), rows, s.health_timeout_s,
                               frozenset(name for name, svc in services.items() if svc.on_demand),
                               s.on_demand_min_resident_s)


def oversubscribed(host: str, s: Settings, plan: dict, needs: dict[str, float]) -> str:
    """The refusal of an oversubscribed host: every share, and the numbers that fit."""
    shares = ", ".join(f"{name} {row['share']:g} ({row['bytes'] / 1e9:.1f} GB)"
                       f"{' on demand' * bool(row.get('on_demand'))}" for name, row in plan["shares"].items())
    services = round(plan["total"] - s.gpu_memory_utilization, 6)
    fits = ", ".join(f"{name} needs >= {need:g}" for name, need in needs.items())
    summed = ("the always-on shares and the largest on-demand one sum to"
              if any(row.get("on_demand") for row in plan["shares"].values())
              else "gpu_memory_utilization shares sum to")
    return (f"{host}: the host's GPU memory is oversubscribed: {summed} "
            f"{plan['total']:g} > gpu_memory_budget {s.gpu_memory_budget:g}: {shares}. What fits: {fits}; "
            f"beside the services' {services:g} the chat gets <= {round(s.gpu_memory_budget - services, 6):g} "
            f"(gpu_memory_utilization); lower a share (gpu_memory_utilization, or kv_cache_memory_bytes where set)"
            f", mark a rarely used service on_demand, or move a service to another host")


def port_problems(host: str, s: Settings, ports: dict[str, int]) -> list[str]:
    """Each service's port distinct from every other port of the host: the chat API, the peer share, the front
    door and the other services (the front door checks its own port against the others on its hosts)."""
    taken = {"api_port": s.api_port, "peer_port": s.peer_port, "front_door_port": s.front_door_port}
    owners: dict[int, list[str]] = {}
    for owner, port in [*taken.items(), *((f"services[{n!r}].api_port", p) for n, p in ports.items())]:
        owners.setdefault(port, []).append(owner)
    problems = [f"{host}: port {port} is taken by {' and '.join(names)}: give each its own port"
                for port, names in owners.items() if len(names) > 1 and any(n.startswith("services") for n in names)]
    return problems + [f"{host}: services[{n!r}].api_port={p} leaves no room for its engine's loopback port "
                       f"(api_port + {paths.ENGINE_PORT_OFFSET}): set it <= {paths.MAX_API_PORT}"
                       for n, p in ports.items() if p > paths.MAX_API_PORT]


Resolver = Callable[[Settings], "tuple[Manifest | None, dict | None, str | None]"]
# A chat service's release checked as the host's chat model's is (release/plan.py release_problems); the last
# argument: its model is a GGUF one (None: unknown offline)
ChatProblems = Callable[[str, Settings, "dict | None", list[str], "bool | None"], list[str]]


def context_share(plan: ServicePlan, memory_bytes: int) -> float | None:
    """The share of a chat service whose entry sets none, on an engine whose KV cache is exactly its context (its
    descriptor's kv_cache_is_context: llama-server's -c max_model_len): it asks what its weights, that cache and
    the reserve take (as a fixed KV cache does), not its recipe's share of a whole Spark. None when the fit cannot
    be computed (its check names why)."""
    try:
        report = plan.fit(memory_bytes)
    except ValueError:
        return None
    kv_bytes = report.max_model_len * report.kv_bytes_per_token
    return fixed_kv_share(plan.weight_bytes, plan.reserve_bytes, kv_bytes, memory_bytes)


def chat_args(where: str, plan: ServicePlan) -> tuple[list[str], bool | None, list[str]]:
    """(a chat service's arguments by its own engine, whether its model is GGUF, the problems): the .gguf file
    llama.cpp loads from its manifest (or offline its model_files), as the host's own model's."""
    own = _required(plan.settings)
    files = [f.path for f in plan.manifest.files] if plan.manifest else None
    try:
        entry, problems = gguf_entry(own, files), []
    except ValueError as exc:  # the files hold several GGUF models
        entry, problems = None, [f"{where}: {exc}"]
    return engine_for(own).args(own, plan.model_dir, entry), is_gguf_model(own, files), problems


def plan_services(host: str, s: Settings, docker_options: Callable[[str, int], list[str]],
                  resolve: Resolver | None = None,
                  chat_problems: ChatProblems | None = None) -> tuple[list[ServicePlan], list[str]]:
    """Each service of a host planned (its model asked of `resolve` when given), and every problem found:
    settings, flags, ports, each service's fit in its share and the host's memory plan."""
    plans, problems = [], []
    for name in s.services:
        chosen, service, found, own = merged(host, name, s)
        entry_keys = s.services[name].model_fields_set
        problems += found
        if not service or not chosen:  # None together: `found` says why
            continue
        plan = ServicePlan(name, chosen, service, s.model_root, settings=own,
                           image=own.engine_image if own and own.engine_image != s.engine_image else None)
        if resolve:
            plan.manifest, plan.config, plan.hub_error = resolve(own or s.model_copy(update={
                "model_repo": service.model_repo, "model_revision": service.model_revision, "model_files": None}))
        where = f"{host}: service {name!r}"
        if service.kv_cache_memory_bytes:  # its share is what the fixed cache, the weights and the reserve take
            share = fixed_kv_share(plan.weight_bytes, plan.reserve_bytes, service.kv_cache_memory_bytes,
                                   host_memory_bytes(s.host_memory_gb))
            if share > 1:
                problems.append(kv_too_big(where, service.kv_cache_memory_bytes, plan.weight_bytes, share))
                continue
            service = plan.service = service.model_copy(update={"gpu_memory_utilization": share})
            own = plan.settings = own and own.model_copy(update={"gpu_memory_utilization": share})
        elif (own and engines.descriptor(own.engine).kv_cache_is_context
              and "gpu_memory_utilization" not in entry_keys
              and (context := context_share(plan, host_memory_bytes(s.host_memory_gb)))):
            service = plan.service = service.model_copy(update={"gpu_memory_utilization": context})
            own = plan.settings = own.model_copy(update={"gpu_memory_utilization": context})
        plan.docker_options = docker_options(plan.model_dir, _required(service.api_port))
        if own:  # a chat model: its engine's own arguments, options and checks, as the host's chat model's
            plan.docker_options += engine_for(own).docker_options(own)
            plan.engine_args, gguf, found = chat_args(where, plan)
            problems += found + (chat_problems or (lambda *_: []))(where, own, plan.config or chosen.model.config,
                                                                    plan.engine_args, gguf)
        else:
            plan.engine_args = POOLING.service_args(chosen.kind, service, plan.model_dir)
            problems += args_problems(where, s, service, plan.engine_args)
        unreadable = plan.config is not None and config_problem(plan.config, _required(service.model_repo))
        if unreadable:
            problems.append(f"{where}: {unreadable}")
            plan.config = None  # the recipe's facts stand in, so the rest of the plan can still be checked
        try:
            refusal = check_fit(plan.fit(host_memory_bytes(s.host_memory_gb)))
        except ValueError as exc:  # a key the fit needs is missing (config.json lacks ...)
            refusal = f"{exc} ({service.model_repo})"
        if refusal:
            setting = "kv_cache_memory_bytes" if service.kv_cache_memory_bytes else "gpu_memory_utilization"
            problems.append(f"{where}: {sized_by(refusal, bool(service.kv_cache_memory_bytes))} "
                            f"(its share: services[{name!r}].{setting})")
        plans.append(plan)
    problems += port_problems(host, s, {p.name: _required(p.service.api_port) for p in plans})
    memory = memory_plan(s, {p.name: p.service for p in plans})
    if not memory["fits"]:
        memory_bytes = host_memory_bytes(s.host_memory_gb)
        problems.append(oversubscribed(host, s, memory, {p.name: min_share(p.fit(memory_bytes)) for p in plans}))
    return plans, problems


def plan_rows(plan) -> list[tuple[str, str]]:
    """`plan`'s rows for a host with services: the one memory plan, then each service's share and fit."""
    from sparkfleet.tables import literal  # extra_engine_args are text: a "[/]" in one is no markup
    if not plan.services:
        return []
    memory, gib = plan.memory_plan, 1024**3
    shares = " + ".join(f"{name} {row['share']:g} ({row['bytes'] / 1e9:.1f} GB)"
                        for name, row in memory["shares"].items() if not row.get("on_demand"))
    on_demand = ", ".join(f"{name} {row['share']:g} ({row['bytes'] / 1e9:.1f} GB)"
                          for name, row in memory["shares"].items() if row.get("on_demand"))
    rows = [("memory plan", f"{shares}{f'; on demand, one at a time beside them: {on_demand}' if on_demand else ''}"
                            f" = {memory['total']:g}{' at most' * bool(on_demand)} of gpu_memory_budget "
                            f"{memory['budget']:g}")]
    for svc in plan.services:
        fit = svc.fit(host_memory_bytes(plan.settings.host_memory_gb))
        source = "the hub's manifest" if svc.manifest else f"recipe {svc.recipe.name}, offline"
        rows.append((f"service {svc.name}", (
            f"{svc.kind} {svc.service.served_model_name} on port {svc.service.api_port} ({svc.unit}"
            f"{f', {svc.engine.label} from {literal(svc.engine_ref)}' if svc.image else ''}); share "
            f"{svc.service.gpu_memory_utilization:g}: weights {fit.weights_bytes / gib:.2f} GiB ({source}) + reserve "
            f"{fit.reserve_bytes / gib:.1f} + KV {fit.kv_memory_bytes / gib:.2f} GiB at {fit.kv_bytes_per_token:,} "
            f"B/token: largest context {fit.largest_context:,} (max_model_len {fit.max_model_len:,}); "
            f"{literal(' '.join(svc.engine_args[1:]))}")))
    return rows
