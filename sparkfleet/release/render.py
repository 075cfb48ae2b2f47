"""Render what a release puts on a host: the units and env files, from templates that look like them."""

from __future__ import annotations

import re

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from sparkfleet import TEMPLATES_DIR
from sparkfleet.contract import formats, paths

_templates = Environment(
    loader=FileSystemLoader(TEMPLATES_DIR),
    undefined=StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
)

_SYSTEMD_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def systemd_quote(arg: str) -> str:
    """Quote one argument for a unit line (systemd's own quoting rules: `%` specifiers, `$` variables).

    A control character cannot be quoted (a newline ends the directive), so it
    is refused here too, though the settings types already refuse it.
    """
    if _CONTROL.search(arg):
        raise ValueError("a control character cannot be written into a systemd unit line")
    arg = arg.replace("%", "%%").replace("$", "$$")
    if _SYSTEMD_SAFE.fullmatch(arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


_templates.globals["q"] = systemd_quote  # every template quotes a value for its unit line as {{ q(value) }}


def _pairs(args: list[str]) -> list[list[str]]:
    """Group `--flag value` pairs so the unit shows one flag per line."""
    grouped: list[list[str]] = []
    for arg in args:
        if grouped and not arg.startswith("-") and grouped[-1][0].startswith("-") and len(grouped[-1]) == 1:
            grouped[-1].append(arg)
        else:
            grouped.append([arg])
    return grouped


def _lines(args: list[str]) -> list[str]:
    return [" ".join(systemd_quote(a) for a in pair) for pair in _pairs(args)]


def _engine_unit(plan, served_name: str, share: float, container: str, docker_options: list[str],
                 args: list[str], description: str, image: str | None = None, on_demand: bool = False) -> str:
    """An engine unit (the chat model's or a service's): one template for every engine, named after the chat's
    unit (paths.UNIT_NAME), its Description the engine's (release/engines/)."""
    return _templates.get_template(f"{paths.UNIT_NAME}.j2").render(
        on_demand=on_demand,
        s=plan.settings,
        description=description,
        served_name=served_name,
        share=share,
        container=container,
        image=image or plan.engine_ref,
        release_id=plan.chat_release_id or "unresolved",
        release_file=paths.RELEASE_FILE,
        memcheck=paths.MEMCHECK,
        memory_plan=paths.MEMORY_PLAN,
        docker_options=_lines(docker_options),
        engine_args=_lines(args),
        ray_unit=paths.RAY_UNIT_NAME if plan.group and container == plan.settings.container_name else None,
    )


def unit(plan) -> str:
    """The chat model's unit: it names the chat's part of the release, so a service added or dropped
    leaves it (and the running model) alone."""
    s = plan.settings
    return _engine_unit(plan, s.served_model_name, s.gpu_memory_utilization, s.container_name, plan.docker_options,
                        plan.engine_args, plan.engine.description)


def service_unit(plan, svc) -> str:
    """A service's unit (sparkfleet-vllm-<name>.service): its engine (vLLM for a pooling model, a chat service's
    own), its image (the host's, or a chat service's own pinned one), the host's env file and memory check."""
    return _engine_unit(plan, svc.service.served_model_name, svc.service.gpu_memory_utilization, svc.container,
                        svc.docker_options, svc.engine_args, svc.engine.description, svc.engine_ref,
                        on_demand=svc.on_demand)


def on_demand_socket(plan, svc) -> str:
    """An on-demand service's socket unit: systemd listens where the guard forwards, and starts the proxy."""
    return _templates.get_template("sparkfleet-ondemand.socket.j2").render(
        served_name=svc.service.served_model_name, host=paths.ON_DEMAND_HOST,
        port=paths.engine_port(svc.service.api_port), proxy=svc.proxy, backlog=plan.settings.on_demand_max_waiting)


def on_demand_proxy(plan, svc) -> str:
    """An on-demand service's proxy unit: it requires the engine's unit (so starts it), waits for it to answer,
    then forwards each connection; it exits after the idle time, and the engine's unit, unneeded, stops."""
    s = plan.settings
    return _templates.get_template("sparkfleet-ondemand-proxy.service.j2").render(
        served_name=svc.service.served_model_name, engine_unit=svc.unit, socket=svc.socket,
        idle_s=svc.service.on_demand_idle_s or s.on_demand_idle_s, wait_s=s.health_timeout_s,
        helper=paths.ON_DEMAND_HELPER, proxyd=paths.SOCKET_PROXYD, serving=paths.SERVING_FILE,
        engine=f"{paths.ENGINE_HOST}:{paths.engine_port(svc.service.api_port)}")


def share_unit(s, lan_address: str) -> str:
    return _templates.get_template("sparkfleet-share.service.j2").render(
        s=s, lan_address=lan_address, bin_dir=paths.BIN_DIR, token_file=paths.FLEET_TOKEN, user=paths.SHARE_USER)


def ray_unit(plan) -> str:
    """A group member's Ray node: `ray start` in the engine image, the head opening the cluster, a worker joining.

    Restart=always: a worker that starts before the head (or loses it) joins on a later try.
    """
    s, group = plan.settings, plan.group
    return _templates.get_template("sparkfleet-ray.service.j2").render(
        s=s,
        group=group,
        role=plan.role,
        container=paths.RAY_CONTAINER,
        image=plan.engine_ref,
        release_id=plan.chat_release_id or "unresolved",
        release_file=paths.RELEASE_FILE,
        docker_options=_lines(plan.ray_docker_options),
        ray_args=_lines(group.ray_start_args(plan.name, s.ray_start_args)),
    )


def engine_env(s, fabric: dict[str, str], key_var: str | None = formats.DEFAULT_KEY_VAR,
               also: tuple[str, ...] = ()) -> str:
    """The engine containers' environment file (contract/formats.py): the API key under the engine's name for it
    (and under `also`, its services' other engines' names), a member's fabric variables, then engine_env (settings
    refuse an engine_env key that sparkfleet derives)."""
    return formats.engine_env(s.api_key, {**fabric, **s.engine_env}, key_var, also)


def hub_env(s) -> str:
    return formats.hub_env(s.hub_token)
