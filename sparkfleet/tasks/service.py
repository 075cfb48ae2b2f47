"""Stage 4: the systemd units that run vLLM in Docker; restarted only when something changed.

A member of a tensor-parallel group runs a Ray node (sparkfleet-ray.service); only its head runs vLLM. pyinfra
runs each operation on every host before the next one, so the Ray operations come before the vLLM unit's: every
member's Ray node is up before the head's engine starts."""

import json

from pyinfra import host, state
from pyinfra.api import deploy

from sparkfleet import FILES_DIR
from sparkfleet.controller.fleet_token import ray_token
from sparkfleet.contract import paths
from sparkfleet.host.managed import managed_absent, managed_file, managed_unit
from sparkfleet.host.operations import (
    image_pinned,
    release_kept_for_rollback,
    secret_file,
)
from sparkfleet.host.preflight import HostFacts
from sparkfleet.contract.formats import memory_plan_json
from sparkfleet.controller.progress import watch
from sparkfleet.host.run import ModelResult, ServiceResult
from sparkfleet.host.services import services_pruned
from sparkfleet.host.serving import start_limit_cleared
from sparkfleet.host.state import unit_state
from sparkfleet.release.plan import HostPlan


def unit_removed(unit_name: str, unit_path: str, why: str) -> None:
    """A unit this host no longer runs: stopped, disabled, its file gone (on a host that never had it, no
    operation is registered: host/drift.py)."""
    managed_unit(name=f"{unit_name} stopped and disabled ({why})", service=unit_name, running=False,
                 enabled=False)
    removed = managed_absent(name=f"{unit_name} removed", path=unit_path)
    if removed.will_change:
        managed_unit(name=f"systemd reloaded without {unit_name}", service=unit_name, daemon_reload=True)


def ray_node(plan: HostPlan) -> bool:
    """A member's Ray node running (its unit, the group's token, the Ray check helper); a host in no group runs none
    (one left from when it was a member is removed, with its token). Returns whether the Ray node restarts: the
    head's engine restarts with it. A new token (the controller's file deleted) restarts every member's node."""
    if not plan.group:
        unit_removed(paths.RAY_UNIT_NAME, paths.RAY_UNIT_PATH, "this host is in no tensor-parallel group")
        managed_absent(name="Ray token removed (this host is in no tensor-parallel group)", path=paths.RAY_TOKEN)
        return False
    token = secret_file(name=f"Ray token of {plan.group.name} (root-only)", dest=paths.RAY_TOKEN,
                        content=ray_token(plan.group.name))
    managed_file(name="Helper sparkfleet-ray-check", src=str(FILES_DIR / "sparkfleet-ray-check"), dest=paths.RAY_CHECK,
                 mode="0755")
    ray_unit = managed_file(name=f"Ray unit ({plan.role} of {plan.group.name})", content=plan.render_ray_unit(),
                            dest=paths.RAY_UNIT_PATH, mode="0644")
    start_limit_cleared(name="Start limit of a failed Ray unit reset", unit=paths.RAY_UNIT_NAME)
    restarted = ray_unit.will_change or token.will_change
    managed_unit(name=f"Ray {plan.role} enabled and running", service=paths.RAY_UNIT_NAME, running=True,
                 enabled=True, restarted=restarted, daemon_reload=ray_unit.will_change)
    return restarted


def engine_image(plan: HostPlan) -> None:
    """The release's engine image present with its pinned digest (the units, Ray's too, run it); a rollout's
    staging gets it while the host serves (`sparkfleet.tasks.stage`), so the service stage then finds it."""
    s = plan.settings
    source = "loaded from the controller's archive" if s.engine_image_archive else "pulled by digest"
    image_pinned(name=f"Engine image {s.engine_image} as {plan.engine_ref} ({source} if missing, then checked)",
                 image=s.engine_image, ref=plan.engine_ref, digest=plan.image_pin.digest,
                 archive=s.engine_image_archive)
    service_images(plan)


def service_images(plan: HostPlan) -> None:
    """Each chat service's own engine image (another than the host's) present with its pinned digest, pulled as
    the host's is, before its unit starts."""
    for svc in plan.services:
        if svc.image:
            image_pinned(name=f"Service {svc.name}: engine image {svc.image} as {svc.engine_ref} (pulled by digest "
                              f"if missing, then checked)", image=svc.image, ref=svc.engine_ref,
                         digest=svc.image_pin.digest)


def on_demand(plan: HostPlan, svc, changed: bool, daemon_reload: bool):
    """An on-demand service: its socket listening and enabled, its proxy in place, its engine's unit never enabled
    (the socket starts it). A change stops a running engine (the health gate starts the new one through its proxy).
    Returns the engine's operation: its change means the gate must wake it."""
    proxy = managed_file(name=f"Service {svc.name}: proxy unit {svc.proxy}", content=plan.render_on_demand_proxy(svc),
                         dest=paths.unit_path(svc.proxy), mode="0644")
    socket = managed_file(name=f"Service {svc.name}: socket unit {svc.socket}",
                          content=plan.render_on_demand_socket(svc), dest=paths.unit_path(svc.socket), mode="0644")
    reload = daemon_reload or proxy.will_change or socket.will_change
    # its unit has no [Install]: "static", unless an always-on release linked it to start at boot
    linked = unit_state(host, svc.unit).get("linked", False)
    engine = managed_unit(name=f"Service {svc.name} ({svc.kind}, port {svc.service.api_port}) on demand: started by "
                          f"its first request, not at boot", service=svc.unit, enabled=False if linked else None,
                          running=False if changed or proxy.will_change else None, daemon_reload=reload)
    managed_unit(name=f"Service {svc.name}: {svc.socket} listening", service=svc.socket, running=True, enabled=True,
                 restarted=socket.will_change)
    return engine


@deploy("Service")
def service(plan: HostPlan, facts: HostFacts, *, model_result: ModelResult) -> ServiceResult:
    """Returns the service operation (its change means a (re)start; None on a worker, which runs no engine), the
    model dirs to keep, and each RAG service's start operation by name: a model whose files change restarts
    the engine that serves it.

    The installed release record comes from preflight, which stopped the host if
    it was not a readable JSON object: it is built on here, never guessed.
    """
    engine_image(plan)
    unit_text = plan.render_unit() if plan.runs_engine else None
    installed = facts.release.value or {}
    release_kept_for_rollback(name="Running release kept for rollback (without its secrets)",
                              installed_release=installed.get("release_id"), new_release=plan.release_id)
    env = secret_file(name="Engine environment (root-only)", dest=paths.ENGINE_ENV, content=plan.render_engine_env())
    unit = managed_file(name=f"{plan.engine.label} unit", content=unit_text, dest=paths.UNIT_PATH,
                        mode="0644") if plan.runs_engine else None
    record = plan.release_record(installed)
    managed_file(name="Release record", content=json.dumps(record, indent=2) + "\n",
                 dest=paths.RELEASE_FILE, mode="0644")
    services_pruned(name="Units of services dropped from the settings stopped and removed",
                    keep=[unit for svc in plan.services
                          for unit in ((svc.unit, svc.socket, svc.proxy) if svc.on_demand else (svc.unit,))])
    managed_file(name="Memory plan (every engine unit's share, the budget, the order they start in)",
                 content=memory_plan_json(plan.memory_plan), dest=paths.MEMORY_PLAN, mode="0644")
    ray_restarted = ray_node(plan)
    fetches = model_result.fetched.will_change  # the chat model's (the RAG services' are small)
    if not plan.runs_engine:
        unit_removed(paths.UNIT_NAME, paths.UNIT_PATH,
                     f"a worker of {plan.group.name} runs no {plan.engine.label} unit")
        started = None
        watch(state, host, fetch=fetches)
    else:
        start_limit_cleared(name="Start limit of a failed unit reset (a converge tries again)", unit=paths.UNIT_NAME)
        restarted = unit.will_change or env.will_change or model_result.fetched.will_change or ray_restarted
        # progress while this run fetches or (re)starts the engine, decided from what is known (the batched read)
        watch(state, host, fetch=fetches, engine=restarted or not unit_state(host, paths.UNIT_NAME)["running"])
        started = managed_unit(
            name=f"{plan.engine.label} service enabled and running",
            service=paths.UNIT_NAME, running=True, enabled=True, restarted=restarted, daemon_reload=unit.will_change,
        )
    services_started = {}
    for svc in plan.services:
        svc_unit = managed_file(name=f"Service {svc.name}: unit {svc.unit}",
                                content=plan.render_service_unit(svc), dest=paths.unit_path(svc.unit),
                                mode="0644")
        start_limit_cleared(name=f"Service {svc.name}: start limit of a failed unit reset", unit=svc.unit)
        fetched = model_result.services_fetched.get(svc.name)
        changed = svc_unit.will_change or env.will_change or bool(fetched and fetched.will_change)
        if svc.on_demand:
            services_started[svc.name] = on_demand(plan, svc, changed, daemon_reload=svc_unit.will_change)
            continue
        services_started[svc.name] = managed_unit(
            name=f"Service {svc.name} ({svc.kind}, port {svc.service.api_port}) enabled and running",
            service=svc.unit, running=True, enabled=True, daemon_reload=svc_unit.will_change, restarted=changed,
        )
    return ServiceResult(started=started, keep=record["model_history"] + record.get("service_model_dirs", []),
                         services_started=services_started)
