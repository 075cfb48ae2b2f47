"""The plan: everything knowable about each host's release, with no host touched.

settings (validated) + manifest (from the hub) + engine arguments + unit
= a release, content-addressed by its release id.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from sparkfleet.contract import engines, paths
from sparkfleet.contract.formats import host_memory_bytes
from sparkfleet.contract.monitoring import SERVICE_ROLE, backend_hop, is_service_host
from sparkfleet.contract.reach import http_url, lan_address
from sparkfleet.contract.serving import watchdog_service
from sparkfleet.model.config import ModelShape, config_problem, model_shape
from sparkfleet.model.fit import (
    REFERENCE_DECODE_TOKENS_PER_S,
    RESERVE_BYTES,
    FitReport,
    check_fit,
    fit_report,
    fixed_kv_share,
)
from sparkfleet.model.manifest import Manifest, model_dir
from sparkfleet.contract.recipes import catalogue, known_model
from sparkfleet.release import render
from sparkfleet.release.engines import Engine, engine_for, engine_problems, gguf_entry, is_gguf_model
from sparkfleet.release.group import TensorParallelGroup, plan_groups
from sparkfleet.release.image import ImagePin, offline_image
from sparkfleet.release.services import ServicePlan, kv_too_big, memory_plan, plan_services, sized_by
from sparkfleet.contract.settings import GROUPS_KEY, Settings, SettingsError, parse_settings

ENV_DIGEST_LABEL = b"sparkfleet engine_env release digest\0"


def env_digest(env: dict[str, str], api_key: str | None) -> str:
    """engine_env (names and values) as the release id takes it: an HMAC-SHA256 keyed by the engines' `api_key`
    (the inventory's secret, which only the controller and the hosts' root hold), so an env change is a new
    release while neither the id nor the plan lets anyone check a guessed value (a plain hash would). The same env
    gives the same digest on every run and controller. A fleet with no `api_key` has no secret to key it with:
    the label alone keys it, and a guessable value could be checked against the id."""
    key = hashlib.sha256(ENV_DIGEST_LABEL + (api_key or "").encode()).digest()
    return hmac.new(key, json.dumps(sorted(env.items())).encode(), hashlib.sha256).hexdigest()


# how the engine container gets the GPU: the legacy runtime hook (can lose it on a daemon-reload) or CDI
GPU_OPTIONS = {"runtime": ("--gpus", "all"), "cdi": ("--device", "nvidia.com/gpu=all")}


@dataclass
class HostPlan:
    name: str
    settings: Settings
    manifest: Manifest | None
    hub_error: str | None
    shape: ModelShape | None  # None: no hub answer and no recipe knows the model
    engine_args: list[str] = field(default_factory=list)
    config: dict | None = None  # the model's config.json (or the recipe's copy when the hub is out of reach)
    known_weight_bytes: int | None = None  # the recipe catalogue's safetensors total (offline plans)
    lan_address: str = ""
    peer_urls: list[str] = field(default_factory=list)  # other hosts sharing this model, seed first
    services: list[ServicePlan] = field(default_factory=list)  # pooling models beside the chat model (RAG)
    group: TensorParallelGroup | None = None  # the tensor-parallel group this host is a member of
    image_pin: ImagePin | None = None  # engine_image pinned by content; None: unknown (image_error says why)
    image_error: str | None = None
    is_service: bool = False  # a service host (front door, monitoring): no model, engine, release or GPU
    backend_tls: bool = False  # every hop to a guard is TLS with the fleet CA's certificates (`fleet_tls`)

    @property
    def engine_ref(self) -> str:
        """What the units run: the pinned reference (name@digest, or an archive's image id); the tag as written
        only in a plan that could not pin it (deploy refuses such a plan)."""
        return self.image_pin.ref if self.image_pin else self.settings.engine_image

    @property
    def role(self) -> str:
        """"single" (no group), "head" (Ray head and the group's vLLM), "worker" (a Ray node only), or "service"
        (a host of only the front door and monitoring groups: no engine at all)."""
        if self.is_service:
            return SERVICE_ROLE
        return self.group.role(self.name) if self.group else "single"

    @property
    def runs_engine(self) -> bool:
        """Whether this host runs the vLLM unit: a worker lends its GPU to the head's engine through Ray."""
        return self.role not in ("worker", SERVICE_ROLE)

    @property
    def units(self) -> list[str]:
        """Every unit this release runs, in start order (a member's Ray node before the head's engine, the chat engine
        before the services): the record names them, so a rollback brings back exactly these."""
        return [*([paths.RAY_UNIT_NAME] if self.group else []), *([paths.UNIT_NAME] if self.runs_engine else []),
                *(svc.unit for svc in self.services)]

    @property
    def model_role(self) -> str:
        """Where this host's model bytes come from: "controller", "peer" (the LAN), or "hub"."""
        if self.settings.model_source == "controller":
            return "controller"
        return "peer" if self.peer_urls else "hub"

    @property
    def weights_source(self) -> str | None:
        """Where the fit's weight bytes come from: "manifest" (the hub's exact sizes), "recipe", or None."""
        if self.manifest:
            return "manifest"
        return "recipe" if self.known_weight_bytes else None

    @property
    def unknown(self) -> str | None:
        """What this plan cannot know (no hub answer and no recipe for the model), or None."""
        if self.config and self.weights_source:
            return None
        return (f"{self.hub_error or 'not resolved'}, and no recipe in the catalogue knows "
                f"{self.settings.model_repo}: its config.json (KV bytes per token, context limit, MTP layers) and "
                f"weight bytes are unknown, so there is no memory fit and no roofline; plan with the hub "
                f"reachable, or add a recipe (recipes/*.toml)")

    @property
    def speculative_tokens(self) -> int:
        """Draft tokens per step the fit counts: speculative_method "mtp" on a model with MTP layers, else 0."""
        s = self.settings
        has_draft = bool(self.shape and self.shape.mtp_layers)
        return (s.num_speculative_tokens or 0) if s.speculative_method == "mtp" and has_draft else 0

    @property
    def fit(self) -> FitReport | None:
        """Memory and speed of this release on a host: the manifest's weight bytes, else the recipe's."""
        if not (self.config and self.weights_source and self.shape):
            return None
        s = self.settings
        weights = self.manifest.weight_bytes if self.manifest else (self.known_weight_bytes or 0)
        return fit_report(self.config, weights,
                          memory_bytes=host_memory_bytes(s.host_memory_gb),
                          gpu_memory_utilization=s.gpu_memory_utilization,
                          max_model_len=min(s.max_model_len, self.shape.max_position_embeddings),
                          kv_cache_dtype=s.kv_cache_dtype, max_num_seqs=s.max_num_seqs,
                          bandwidth=s.memory_bandwidth_gbs * 1e9, num_speculative_tokens=self.speculative_tokens,
                          tensor_parallel_size=s.tensor_parallel_size)

    @property
    def share_url(self) -> str:
        """Where the other hosts fetch this host's model share (contract/reach.py: its LAN address)."""
        root = http_url(self.lan_address, self.settings.peer_port)
        return f"{root}/{self.manifest.dir_name if self.manifest else ''}"

    @property
    def model_dir(self) -> str:
        return model_dir(self.settings.model_root, self.settings.model_repo, self.manifest)

    def _release_body(self, with_services: bool) -> dict:
        manifest = self.manifest
        if manifest is None:  # release_id and chat_release_id have none to give
            raise ValueError(f"{self.name}: no manifest, so no release")
        return {
            "model": [manifest.hub, manifest.repo, manifest.pin, manifest.digest],
            "image": self.engine_ref,  # pinned: the same bytes by tag or by digest are one release
            "args": self.engine_args,
            "docker": self.docker_options,
            **({"services": [svc.identity() for svc in self.services]} if with_services and self.services else {}),
            # the release's, not the unit's: the unit's text holds no env, so an env change restarts it once (its
            # env file changed), and rolling it back changes no unit
            **({"env": env_digest(self.settings.engine_env, self.settings.api_key)}
               if with_services and self.settings.engine_env else {}),
            **({"group": {**self.group.to_dict(), "ray_start_args": self.settings.ray_start_args}}
               if self.group else {}),
        }

    @property
    def release_id(self) -> str | None:
        """Same inputs, same id: model content, image (its digest: a tag moved to other bytes is a new release),
        engine arguments, container options, each service's, and engine_env (keyed: `env_digest`)."""
        if not self.manifest:
            return None
        return hashlib.sha256(json.dumps(self._release_body(True), sort_keys=True).encode()).hexdigest()[:12]

    @property
    def chat_release_id(self) -> str | None:
        """The chat model's part of the release: what its unit names, so adding a service never restarts it."""
        if not self.manifest:
            return None
        return hashlib.sha256(json.dumps(self._release_body(False), sort_keys=True).encode()).hexdigest()[:12]

    @property
    def engine(self) -> Engine:
        """The engine the settings choose (release/engines/): its arguments, options, key and refusals."""
        return engine_for(self.settings)

    @property
    def docker_options(self) -> list[str]:
        """The engine container's options; a group's (the head's, also recorded on a worker) reach Ray: its session
        directory, and the host's process table, where Ray's driver looks for the local raylet (without it the
        engine waits 60 s and fails to connect), and the group's Ray token, read-only."""
        ray = ["--volume", f"{paths.RAY_DIR}:/tmp/ray", "--pid", "host", *_ray_token_volume()] if self.group else []
        return docker_options(self.settings, self.model_dir, self.settings.api_port) + ray + \
            self.engine.docker_options(self.settings)

    @property
    def ray_env(self) -> dict[str, str]:
        """The Ray container's whole environment (the fabric's and Ray's token auth, the token's path, never its
        value): no engine.env, so neither the API key nor engine_env reaches a Ray node."""
        if not self.group:
            raise ValueError(f"{self.name} is a single host: it runs no Ray node")
        return self.group.env(self.name)

    @property
    def ray_docker_options(self) -> list[str]:
        """The Ray container's options: the engine's GPU, host network (the fabric), Ray's environment, Ray's
        session directory shared with the head's engine, the group's token and the model read-only (a worker
        loads its shard of it)."""
        env = [arg for key, value in sorted(self.ray_env.items()) for arg in ("--env", f"{key}={value}")]
        return [*GPU_OPTIONS[self.settings.gpu_device_mode], "--ipc", "host", "--network", "host", "--shm-size", "1g",
                *env, "--volume", f"{paths.RAY_DIR}:/tmp/ray", *_ray_token_volume(),
                "--volume", f"{self.model_dir}:{self.model_dir}:ro", "--entrypoint", "ray"]

    @property
    def watched_services(self) -> list[dict]:
        """The serving file's engines beside the chat model (contract/serving.py watchdog_service)."""
        return [watchdog_service(svc.name, svc.kind, *_served(svc), svc.on_demand, svc.engine.name)
                for svc in self.services]

    def render_service_unit(self, svc: ServicePlan) -> str:
        return render.service_unit(self, svc)

    def render_on_demand_socket(self, svc: ServicePlan) -> str:
        return render.on_demand_socket(self, svc)

    def render_on_demand_proxy(self, svc: ServicePlan) -> str:
        return render.on_demand_proxy(self, svc)

    @property
    def memory_plan(self) -> dict:
        """The host's one memory plan: the chat's share and every service's, against gpu_memory_budget, and the
        order they start in."""
        return memory_plan(self.settings, {svc.name: svc.service for svc in self.services})

    def render_unit(self) -> str:
        if not self.runs_engine:
            if self.group is None:
                raise ValueError(f"{self.name} is a service host: it runs no engine unit")
            raise ValueError(f"{self.name} is a worker of {self.group.name}: it runs no {self.engine.label} unit "
                             f"(only {paths.RAY_UNIT_NAME}); the head {self.group.head} runs the engine")
        return render.unit(self)

    def render_ray_unit(self) -> str:
        """sparkfleet-ray.service of a group member: its Ray node, from the same pinned engine image."""
        if not self.group:
            raise ValueError(f"{self.name} is a single host: it runs no Ray unit")
        return render.ray_unit(self)

    def render_share_unit(self) -> str:
        return render.share_unit(self.settings, self.lan_address)

    def render_engine_env(self) -> str:
        """engine.env, which every engine container of the host reads: the key under each of their engines' names
        (a llama.cpp service beside vLLM reads LLAMA_API_KEY)."""
        also = tuple(dict.fromkeys(svc.engine.key_var for svc in self.services
                                   if svc.engine.key_var not in (None, self.engine.key_var)))
        return render.engine_env(self.settings, self.group.env(self.name) if self.group else {}, self.engine.key_var,
                                 also)

    def render_hub_env(self) -> str:
        return render.hub_env(self.settings)

    def release_record(self, installed: dict | None = None) -> dict:
        """What /etc/sparkfleet/release.json says: this release, the one before, the model dirs to keep,
        and what a rollback's health gate needs to judge this release (no inventory at hand then).

        A re-run of the same release writes the same record (no change).
        """
        installed = installed or {}
        s = self.settings
        current = {
            "release_id": self.release_id,
            "engine": s.engine,
            "model_dir": self.model_dir,
            "manifest": self.manifest.summary() if self.manifest else None,
            "image": self.engine_ref,
            "container": s.container_name,
            "engine_args": self.engine_args,
            "served_model_name": s.served_model_name,
            "api_host": s.api_host,
            "api_port": s.api_port,
            "engine_port": paths.engine_port(s.api_port),
            "health_timeout_s": s.health_timeout_s,
            "tools": s.enable_auto_tool_choice,
            "units": self.units,
            **({"role": self.role, "group": self.group.to_dict()} if self.group else {}),
            **({"services": {svc.name: svc.record() for svc in self.services}} if self.services else {}),
        }
        if installed.get("release_id") in (None, self.release_id):
            previous = installed.get("previous")
        else:
            previous = {k: v for k, v in installed.items() if k not in ("previous", "model_history")}
        history = [self.model_dir]
        for directory in [(previous or {}).get("model_dir"), *installed.get("model_history", [])]:
            if directory and directory not in history:
                history.append(directory)
        record = {**current, "previous": previous, "model_history": history[: self.settings.keep_releases]}
        service_dirs = [svc.model_dir for svc in self.services]
        for kept in (previous or {}).get("services", {}).values():
            if kept.get("model_dir") and kept["model_dir"] not in service_dirs:
                service_dirs.append(kept["model_dir"])  # the previous release's, for a rollback
        return {**record, "service_model_dirs": service_dirs} if service_dirs else record

    def to_dict(self) -> dict:
        if self.is_service:
            return {"name": self.name, "role": self.role, "release_id": None, "lan_address": self.lan_address}
        return {
            "name": self.name,
            "release_id": self.release_id,
            "image": self.settings.engine_image,
            "image_pinned": self.image_pin and self.image_pin.ref,
            "image_digest": self.image_pin and self.image_pin.digest,
            "image_source": self.image_pin and self.image_pin.source,
            "image_unknown": self.image_error,
            "engine": self.settings.engine,
            "engine_version": self.engine.version(self.settings),
            # the version the RAG services run at (the pooling engine's: vllm_version)
            **{d.version_setting: getattr(self.settings, d.version_setting) for d in engines.able("pooling")},
            "engine_args": self.engine_args,
            "docker_options": self.docker_options,
            "model_dir": self.model_dir,
            "manifest": self.manifest.summary() if self.manifest else None,
            "model_source": self.model_role,
            "peers": self.peer_urls,
            "hub_error": self.hub_error,
            "recipe": self.settings.recipe,
            "speculative": ({"method": self.settings.speculative_method,
                             "num_speculative_tokens": self.settings.num_speculative_tokens}
                            if self.settings.speculative_method else None),
            "weights_source": self.weights_source,
            "fit": self.fit.to_dict() if self.fit else None,
            "unknown": self.unknown,
            "reference_decode_tokens_per_s": REFERENCE_DECODE_TOKENS_PER_S,
            "role": self.role,
            "group": self.group.to_dict() if self.group else None,
            "unit": self.render_unit() if self.runs_engine else None,
            "ray_unit": self.render_ray_unit() if self.group else None,
            "ray_env": self.ray_env if self.group else None,
            "services": [{"name": svc.name, **svc.record(), "hub_error": svc.hub_error,
                          **({"image_unknown": svc.image_error} if svc.image else {}),
                          "fit": svc.fit(host_memory_bytes(self.settings.host_memory_gb)).to_dict(),
                          "docker_options": svc.docker_options, "unit_text": self.render_service_unit(svc)}
                         for svc in self.services],
            "memory_plan": self.memory_plan,
        }


def _served(svc: ServicePlan) -> tuple[str, int]:
    """A service's served name and API port: its recipe's merge sets both (services.py REQUIRED)."""
    name, port = svc.service.served_model_name, svc.service.api_port
    if name is None or port is None:
        raise ValueError(f"service {svc.name}: no served_model_name or api_port, even from its recipe")
    return name, port


def _ray_token_volume() -> list[str]:
    """The group's Ray token file, read-only at the same path (RAY_AUTH_TOKEN_PATH names it)."""
    return ["--volume", f"{paths.RAY_TOKEN}:{paths.RAY_TOKEN}:ro"]


def docker_options(s: Settings, model_dir: str, port: int) -> list[str]:
    """`docker run` options of one engine container (the chat model's or a service's): GPU, network, the
    root-only env file, its model directory read-only."""
    engine = paths.engine_port(port)
    network = ["--network", "host"] if s.docker_network == "host" else [
        "--network", s.docker_network, "--publish", f"{paths.ENGINE_HOST}:{engine}:{engine}"]
    options = [*GPU_OPTIONS[s.gpu_device_mode], "--ipc", "host", *network, "--env-file", paths.ENGINE_ENV,
               "--volume", f"{model_dir}:{model_dir}:ro"]
    if s.privileged:
        options.append("--privileged")
    if s.seccomp_unconfined:
        options += ["--security-opt", "seccomp=unconfined"]
    return options


def release_problems(name: str, s: Settings, shape: ModelShape | None, args: list[str],
                     gguf: bool | None = False) -> list[str]:
    """Known-bad combinations, each refused with the fix (model checks need the model's shape), then the
    engine's own (release/engines/: image, model format, flags); `gguf`: the model is a GGUF one (None: unknown yet)."""
    problems = []
    # seen at vLLM's start-up on GB10; refused whatever the engine until one is shown to start with it
    if shape and s.kv_cache_dtype.startswith("fp8") and shape.hybrid:
        problems.append(
            f"{name}: kv_cache_dtype={s.kv_cache_dtype!r} with {s.model_repo}, a hybrid linear-attention model, "
            f"fails at the engine's start-up on GB10: set kv_cache_dtype = \"auto\""
        )
    if shape and s.max_model_len > shape.max_position_embeddings:
        problems.append(
            f"{name}: max_model_len={s.max_model_len} exceeds {s.model_repo}'s maximum of "
            f"{shape.max_position_embeddings}: set max_model_len <= {shape.max_position_embeddings}"
        )
    if not s.api_is_loopback and not s.api_key and not s.allow_unauthenticated_api:
        problems.append(
            f"{name}: api_host={s.api_host!r} serves the API beyond this machine with no api_key: "
            f"set api_key, or api_host = \"127.0.0.1\", or allow_unauthenticated_api = True to accept the risk"
        )
    if s.api_port > paths.MAX_API_PORT:
        problems.append(f"{name}: api_port={s.api_port} leaves no room for its engine's loopback port "
                        f"(api_port + {paths.ENGINE_PORT_OFFSET}): set api_port <= {paths.MAX_API_PORT}")
    if s.speculative_method and not s.num_speculative_tokens:
        problems.append(f"{name}: speculative_method={s.speculative_method!r} needs num_speculative_tokens "
                        f"(the MTP recipe measured 2): set num_speculative_tokens = 2")
    if s.num_speculative_tokens and not s.speculative_method:
        problems.append(f"{name}: num_speculative_tokens={s.num_speculative_tokens} without speculative_method: "
                        f"set speculative_method = \"mtp\" or remove num_speculative_tokens")
    if shape and s.speculative_method == "mtp" and not shape.mtp_layers:
        problems.append(f"{name}: speculative_method=\"mtp\" but {s.model_repo} has no MTP layer "
                        f"(mtp_num_hidden_layers in its config.json): remove speculative_method")
    if s.enable_auto_tool_choice and not s.tool_call_parser:
        problems.append(f"{name}: enable_auto_tool_choice needs tool_call_parser (e.g. \"qwen3_coder\")")
    remote_code = (getattr(catalogue().get(s.recipe), "trust_remote_code", False), s.allow_trust_remote_code)
    return problems + engine_problems(name, s, args, gguf, remote_code)


# Given a host's settings: (manifest, the model's config.json, None), or (None, None, why not).
Resolver = Callable[[Settings], "tuple[Manifest | None, dict | None, str | None]"]
# Given a host's settings: (engine_image pinned by content, None), or (None, why not).
ImageResolver = Callable[[Settings], "tuple[ImagePin | None, str | None]"]


def _resolve(s: Settings) -> tuple[Manifest | None, dict | None, str | None]:
    """The resolver of an offline plan: nothing is asked, the recipe catalogue's facts stand in."""
    return None, None, "not resolved (offline plan)"


def _plan(name: str, s: Settings, manifest: Manifest | None, config: dict | None,
          hub_error: str | None, resolve: Resolver | None = None,
          known_weight_bytes: int | None = None) -> tuple[HostPlan, list[str]]:
    known = known_model(s.model_repo)  # the check of the settings alone: the recipe's weights size the cache's share
    s, found_kv = fixed_kv(name, s, manifest.weight_bytes if manifest else known_weight_bytes or (
        known.weight_bytes if known else None))
    unreadable = config_problem(config, s.model_repo) if config is not None else None
    config = None if unreadable else config
    shape = model_shape(config) if config else None
    plan = HostPlan(name, s, manifest, hub_error, shape, config=config, known_weight_bytes=known_weight_bytes)
    paths_ = [f.path for f in manifest.files] if manifest else None
    try:
        entry = gguf_entry(s, paths_)
        found_entry = []
    except ValueError as exc:  # the files hold several GGUF models
        entry, found_entry = None, [f"{name}: {exc}"]
    plan.engine_args = engine_for(s).args(s, plan.model_dir, entry)
    problems = (release_problems(name, s, shape, plan.engine_args, is_gguf_model(s, paths_)) + found_entry
                + ([f"{name}: {unreadable}"] if unreadable else []))
    try:
        refusal = plan.fit and check_fit(plan.fit)
    except ValueError as exc:  # a key the fit needs is missing (config.json lacks ...)
        refusal = f"{exc} ({s.model_repo})"
    if refusal:
        problems.append(f"{name}: {sized_by(refusal, bool(s.kv_cache_memory_bytes))}")
    plan.services, found = plan_services(name, s, lambda model_dir, port: docker_options(s, model_dir, port),
                                         resolve, chat_service_problems)
    return plan, found_kv + problems + found


def chat_service_problems(where: str, s: Settings, config: dict | None, args: list[str],
                          gguf: bool | None) -> list[str]:
    """A chat model beside the host's, checked as the host's own is (its model's limits, its engine's flags)."""
    return release_problems(where, s, model_shape(config) if config else None, args, gguf)


def fixed_kv(name: str, s: Settings, weights_bytes: int | None) -> tuple[Settings, list[str]]:
    """The settings with gpu_memory_utilization taken from a fixed KV cache (kv_cache_memory_bytes: the weights,
    the reserve and that cache), and the problems; unchanged without one. While the weights are unknown (the
    check of the settings alone, before the hub is asked) the share counts the cache and the reserve only, so
    that check never refuses a plan the weights would let through."""
    if s.kv_cache_memory_bytes is None:
        return s, []
    weights_bytes = weights_bytes or 0
    if s.tensor_parallel_size > 1:
        return s, [f"{name}: kv_cache_memory_bytes with tensor_parallel_size {s.tensor_parallel_size}: a fixed KV "
                   f"cache is planned on one Spark only: set kv_cache_memory_bytes = None (gpu_memory_utilization "
                   f"sizes each member's cache)"]
    share = fixed_kv_share(weights_bytes, RESERVE_BYTES, s.kv_cache_memory_bytes, host_memory_bytes(s.host_memory_gb))
    if share > 1:
        return s, [kv_too_big(name, s.kv_cache_memory_bytes, weights_bytes, share)]
    return s.model_copy(update={"gpu_memory_utilization": share}), []


def plan_hosts(hosts: list[tuple[str, dict]], resolve: Resolver | None = None,
               resolve_image: ImageResolver | None = None) -> list[HostPlan]:
    """Plan every host, or raise SettingsError naming every problem of every host.

    Whatever the settings alone can tell is refused before the hub is asked (the
    tensor-parallel groups among them); the fit and the model's own limits are
    checked once the manifest and config.json are read (or the recipe's, offline),
    still before any host is touched.
    `resolve` and `resolve_image` are the only ways out (the commands pass
    `hubs.hub_resolver` and `image.image_resolver`); without them the plan is
    offline and tests never wait for a client.
    """
    problems: list[str] = []
    parsed, services = [], {}
    for name, data in hosts:
        try:
            s = parse_settings(name, data)
        except SettingsError as exc:
            problems += exc.problems
            continue
        if is_service_host(data.get(GROUPS_KEY, ())):
            services[name] = s
            continue
        known = known_model(s.model_repo)
        problems += _plan(name, s, None, known.config if known else None, None)[1]
        parsed.append((name, s))
    groups, found = plan_groups(dict(parsed))
    problems += found
    tls, found = fleet_tls({**dict(parsed), **services}, backend_hop(data.get(GROUPS_KEY, ()) for _, data in hosts))
    problems += found
    if problems:
        raise SettingsError(problems)

    plans = [service_plan(name, s, dict(hosts)[name]) for name, s in services.items()]
    for name, s in parsed:
        manifest, config, hub_error = (resolve or _resolve)(s)
        known = known_model(s.model_repo)
        plan, found = _plan(name, s, manifest, config or (known.config if known else None), hub_error, resolve,
                            known.weight_bytes if known else None)
        plan.lan_address = lan_address(name, dict(hosts)[name], s)
        plan.group = groups.get(name)
        plan.image_pin, plan.image_error = (resolve_image or offline_image)(s)
        for svc in plan.services:  # a chat service of its own image: pinned as the host's is (the lock holds both)
            if svc.image and svc.settings:
                svc.image_pin, svc.image_error = (resolve_image or offline_image)(svc.settings)
        problems += found
        plans.append(plan)
    if problems:
        raise SettingsError(problems)
    _assign_peers(plans)
    for plan in plans:
        plan.backend_tls = tls
    order = [name for name, _ in hosts]
    return sorted(plans, key=lambda p: order.index(p.name))


def fleet_tls(settings: dict[str, Settings], hop: bool) -> tuple[bool, list[str]]:
    """(whether every hop to a guard is TLS, the problems): TLS wherever the inventory has a backend hop (a front
    door or a monitoring host) unless `backend_key_in_clear`; then the fleet CA's two settings are needed. The three
    settings are the fleet's: every host must agree (a door and its guards speak one way). Settings alone: the
    CA's files are read by roles/pki.py `load_ca` before any host is touched."""
    if not settings:
        return False, []
    wanted = {(s.backend_key_in_clear, s.fleet_ca_cert, s.fleet_ca_key) for s in settings.values()}
    if len(wanted) > 1:
        return False, ["settings `fleet_ca_cert`, `fleet_ca_key` and `backend_key_in_clear` differ between hosts: "
                       "they are the fleet's, set them once for all (group_data or the inventory's shared data)"]
    in_clear, cert, key = wanted.pop()
    if not hop or in_clear:
        return False, []
    if not (cert and key):
        return False, ["the backend key would cross the LAN in clear (a front door or monitoring host asks the "
                       "guards): run `sparkfleet init --force` in the project to add the fleet CA (`fleet_ca_cert`, "
                       "`fleet_ca_key`), or set `backend_key_in_clear = True` to send it in clear on purpose"]
    return True, []


def service_plan(name: str, s: Settings, data: dict) -> HostPlan:
    """A service host's plan: its settings and LAN address only; nothing of a release is asked or checked."""
    plan = HostPlan(name, s, None, None, None, is_service=True)
    plan.lan_address = lan_address(name, data, s)
    return plan


def _assign_peers(plans: list[HostPlan]) -> None:
    """In peer mode the first host of each model fetches from the hub; the others from the LAN.

    Each peer lists every other host with the same model, seed first: a host
    that cannot serve is skipped, and the hub is the last resort.
    """
    groups: dict[tuple, list[HostPlan]] = {}
    for plan in plans:
        if plan.manifest and plan.settings.model_source == "peer":
            groups.setdefault((plan.manifest.digest, plan.settings.model_root), []).append(plan)
    for group in groups.values():
        for plan in group[1:]:
            plan.peer_urls = [other.share_url for other in group if other is not plan]
