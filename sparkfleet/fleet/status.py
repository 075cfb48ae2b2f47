"""How each host's service is doing, seen from the controller over its HTTP API."""

from __future__ import annotations

import requests

from sparkfleet.fleet.metrics import read_metrics
from sparkfleet.release.settings import Settings

METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


def api_url(s: Settings, data: dict) -> str | None:
    """Where the controller reaches a host's API, or None when it only listens on loopback."""
    if s.controller_api_url:
        return s.controller_api_url.rstrip("/")
    if s.api_is_loopback:
        return None
    return f"http://{data.get('ssh_hostname', '')}:{s.api_port}"


def api_headers(api_key: str | None) -> dict:
    """The headers an engine's API key asks for (none without a key): status and bench send the same."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def host_status(name: str, s: Settings, data: dict, chat: bool = False) -> dict:
    row = {"host": name, "url": api_url(s, data), "healthy": False, "served": None, "metrics": {}, "error": None}
    if row["url"] is None:
        row["error"] = "API on loopback only: use `pytest tests/infra` (runs the checks on the host)"
        return row
    headers = api_headers(s.api_key)
    try:
        health = requests.get(f"{row['url']}/health", timeout=5)
        models = requests.get(f"{row['url']}/v1/models", headers=headers, timeout=5)
        models.raise_for_status()
        row["served"] = [m["id"] for m in models.json()["data"]]
        metrics = read_metrics(requests.get(f"{row['url']}/metrics", timeout=5).text)
        row["metrics"] = {name: value for name, value in metrics.items() if name in METRICS}
        row["healthy"] = health.status_code == 200 and s.served_model_name in row["served"]
        if chat and row["healthy"]:
            from openai import OpenAI

            client = OpenAI(base_url=f"{row['url']}/v1", api_key=s.api_key or "none", timeout=60)
            reply = client.chat.completions.create(
                model=s.served_model_name, max_tokens=24,
                messages=[{"role": "user", "content": "Say hello from a DGX Spark."}],
                extra_body={"chat_template_kwargs": {"enable_thinking": False}})
            row["chat"] = reply.choices[0].message.content
    except (requests.RequestException, ValueError, KeyError) as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"
    return row


def ssh_facts(host) -> dict:
    """What the host itself says: driver, CUDA, toolkit, release, verified model, unit state."""
    from pyinfra.facts.deb import DebPackage
    from pyinfra.facts.systemd import SystemdStatus

    from sparkfleet.host import paths
    from sparkfleet.host.facts import ModelFiles, NvidiaSmi, read_json_object
    from sparkfleet.host.serving import ServingProbe, watchdog_summary
    from sparkfleet.host.shared import host_module

    gpu = host.get_fact(NvidiaSmi)
    release = read_json_object(host, paths.RELEASE_FILE).value or {}
    toolkit = host.get_fact(DebPackage, package="nvidia-container-toolkit") or {}
    verified = None
    if release.get("model_dir"):
        state = host.get_fact(ModelFiles, model_dir=release["model_dir"], record=paths.VERIFIED_RECORD)
        record, files = state["record"], state["files"]
        expected = (release.get("manifest") or {}).get("files")
        vouched = all(host_module.vouches(entry, files.get(path)) for path, entry in record.items())
        exact = not host_module.extras(record, files, state.get("others", {}))
        verified = bool(record) and len(record) == expected and vouched and exact
    units = host.get_fact(SystemdStatus, services=[paths.UNIT_NAME]) or {}
    return {"driver": gpu.driver, "cuda": gpu.cuda, "toolkit": toolkit.get("version"),
            "release_id": release.get("release_id"), "model_verified": verified,
            "unit_active": bool(units.get(paths.UNIT_NAME)),
            "watchdog": watchdog_summary(host.get_fact(ServingProbe)), "services": services_status(host, release)}


def services_status(host, release: dict) -> dict:
    """Each RAG service of the installed release, asked on the host (its port may listen on loopback only):
    {name: {kind, port, serving, detail}}. A record entry of the wrong shape counts as not serving."""
    from sparkfleet.host.services import ServiceProbe

    found = {}
    for name, svc in sorted((release.get("services") or {}).items()):
        try:
            probe = host.get_fact(ServiceProbe, port=int(svc["api_port"]), served_name=str(svc["served_model_name"]),
                                  kind=str(svc["kind"]), api_host=str(release.get("api_host", "127.0.0.1")))
        except (KeyError, TypeError, ValueError):
            probe = {"serving": False, "detail": "unreadable entry in the release record"}
        found[name] = {"kind": svc.get("kind"), "port": svc.get("api_port"), **probe}
    return found


def services_cell(services: dict) -> str:
    """The `status` table's services column: each service, its port, and whether it answers."""
    return ", ".join(f"{name}:{svc['port']} " + ("answers" if svc["serving"] else f"[red]NOT answering[/] "
                                                  f"({svc['detail'][:80]})") for name, svc in services.items()) or "-"
