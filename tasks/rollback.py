"""Switch a host back to its previous release: the unit, its environment and its release
record kept on disk when the current release replaced them (no download), then the health gate."""

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import server

from sparkfleet.host import paths
from sparkfleet.host.facts import JsonFile, RuntimePath
from sparkfleet.host.operations import health_gate, previous_release_restored


@deploy("Rollback")
def rollback():
    previous = host.get_fact(JsonFile, path=paths.PREVIOUS_RELEASE_FILE)
    current = host.get_fact(JsonFile, path=paths.RELEASE_FILE) or {}
    if not previous or "__invalid__" in previous:
        server.shell(name="No previous release on this host", commands=[
            f"echo '{host.name}: no previous release kept in {paths.PREVIOUS_DIR}: nothing to roll back to' >&2; exit 1"])
        return
    swapped = previous_release_restored(
        name=f"Release {previous['release_id']} restored (was {current.get('release_id')})",
        previous=previous, current=current)
    health_gate(
        name=f"{previous['served_model_name']} answers on port {previous['api_port']}",
        served_name=previous["served_model_name"], api_host="127.0.0.1", port=previous["api_port"],
        tools="--enable-auto-tool-choice" in previous.get("engine_args", []), timeout_s=previous.get(
            "health_timeout_s", 900), runtime=host.get_fact(RuntimePath), _if=swapped.did_change,
    )
