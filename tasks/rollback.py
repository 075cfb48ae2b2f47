"""Switch a host back to its previous release: the unit, its settings and its release record
kept on disk when the current release replaced them (no download), with today's secrets, then
the health gate the previous release's own record describes."""

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, deploy
from pyinfra.operations import server

from sparkfleet.host import paths
from sparkfleet.host.facts import RuntimePath, read_json_object
from sparkfleet.host.operations import previous_release_restored, rollback_problem
from tasks.health import gate


@deploy("Rollback")
def rollback():
    current = read_json_object(host, paths.RELEASE_FILE)
    previous = read_json_object(host, paths.PREVIOUS_RELEASE_FILE)
    problem = current.unreadable or previous.unreadable or rollback_problem(previous.value, previous.path)
    if problem:
        server.shell(name="Nothing to roll back to", commands=[
            StringCommand("echo", QuoteString(problem.line(host.name)), ">&2; exit 1")])
        return
    kept = previous.value
    swapped = previous_release_restored(
        name=f"Release {kept['release_id']} restored (was {(current.value or {}).get('release_id')})",
        previous=kept, current=current.value or {})
    gate(kept["served_model_name"], kept["api_host"], kept["api_port"], kept["tools"], kept["health_timeout_s"],
         host.get_fact(RuntimePath), _if=swapped.did_change)
