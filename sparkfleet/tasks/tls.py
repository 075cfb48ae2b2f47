"""Part of the guard stage, on every host of a fleet whose hops are TLS (`HostPlan.backend_tls`): the fleet CA's
certificate, this host's key (derived from the CA's: the same bytes on every converge) and its certificate, issued
here by the controller only when the host's current one is wrong (roles/pki.py `wrong`: another CA, another key, a
missing name, within 30 days of its end); otherwise nothing changes. The current certificate is read with
preflight's facts (host/preflight.py `converge_reads`): no round trip of its own.

`host_tls` runs once per host and run (the guard stage first; the front door stage gets the same operations back,
to reload when they changed).
"""

from dataclasses import dataclass

from pyinfra import host, state

from sparkfleet.contract import paths
from sparkfleet.contract.settings import SettingsError
from sparkfleet.roles import pki
from sparkfleet.controller.inventory import DeployRefused
from sparkfleet.roles.pki import ca_of
from sparkfleet.host.facts import JsonFile
from sparkfleet.host.managed import managed_directory, managed_file
from sparkfleet.host.operations import secret_file
from sparkfleet.host.run import run_of
from sparkfleet.host.state import fact
from sparkfleet.release.plan import HostPlan


@dataclass(frozen=True)
class HostTls:
    ops: list  # the operations that put this host's TLS files in place ([] where the fleet's hops are plain)
    cert: str | None = None  # the certificate in force after them (the host's, or the one issued now)


def host_tls(plan: HostPlan) -> HostTls:
    """This host's TLS files, put in place once per run (the guard stage first); nothing where the hops are plain."""
    if not plan.backend_tls:
        return HostTls([])
    return run_of(state).once("host tls", plan.name, lambda: _host_tls(plan))


def _host_tls(plan: HostPlan) -> HostTls:
    try:
        ca = ca_of(plan.settings)
    except SettingsError as exc:
        raise DeployRefused(f"invalid fleet CA; no host was changed:\n{exc}") from None
    names = pki.host_names(plan.name, plan.lan_address)
    current = fact(host, JsonFile, path=paths.TLS_HOST_CERT)
    why = pki.wrong(ca, current, plan.name, names)
    managed_directory(name="Fleet TLS directory", path=paths.TLS_DIR, mode="0755")
    ops = [managed_file(name="Fleet CA certificate", content=ca.cert_pem, dest=paths.TLS_CA, mode="0644"),
           secret_file(name="This host's TLS key (root-only)", dest=paths.TLS_HOST_KEY,
                       content=pki.host_key_pem(ca, plan.name))]
    if why:  # the current one stands otherwise: a new one each run would reload every HAProxy each run
        current = pki.issue(ca, plan.name, names)
        ops.append(managed_file(name=f"This host's certificate issued by the fleet CA (the current one: {why})",
                                content=current, dest=paths.TLS_HOST_CERT, mode="0644"))
    return HostTls(ops, current)
