"""Part of the guard stage, on every host of a fleet whose hops are TLS (`HostPlan.backend_tls`): the fleet CA's
certificate, this host's key (derived from the CA's and its key generation: the same bytes on every converge until
`sparkfleet rekey` bumps it) and its certificate, for client use too only on a host of the groups that ask the
guards (`pki.is_client`: a door, a monitoring host), issued here by the controller only when the host's current one
is wrong (roles/pki.py `tls_state`, `wrong`: another CA, another key, a missing name, another use, within 30 days of
its end); otherwise nothing changes. The current certificate is read with preflight's facts
(host/preflight.py `converge_reads`): no round trip of its own.

`host_tls` runs once per host and run (the guard stage first); the front door and node metrics stages get its
result back: what changed (a reload of the door) and the certificate in force (its expiry metric).
"""

from dataclasses import dataclass, field

from pyinfra import host, state

from sparkfleet.contract import paths
from sparkfleet.contract.settings import SettingsError
from sparkfleet.controller.inventory import DeployRefused
from sparkfleet.host.facts import JsonFile
from sparkfleet.host.run import run_of
from sparkfleet.host.state import fact
from sparkfleet.release.plan import HostPlan
from sparkfleet.roles import pki
from sparkfleet.tasks.ensure import ensure


@dataclass(frozen=True)
class HostTls:
    changed: dict[str, bool] = field(default_factory=dict)  # each TLS file: whether this run changes it
    cert: str | None = None  # the certificate in force after them (the host's, or the one issued now)


def host_tls(plan: HostPlan) -> HostTls:
    """This host's TLS files, put in place once per run (the guard stage first); nothing where the hops are plain."""
    if not plan.backend_tls:
        return HostTls()
    return run_of(state).once("host tls", plan.name, lambda: _host_tls(plan))


def _host_tls(plan: HostPlan) -> HostTls:
    try:
        ca = pki.ca_of(plan.settings)
    except SettingsError as exc:
        raise DeployRefused(f"invalid fleet CA; no host was changed:\n{exc}") from None  # refusal: planned
    wanted, cert = pki.tls_state(ca, plan.name, plan.lan_address, fact(host, JsonFile, path=paths.TLS_HOST_CERT),
                                 client=pki.is_client(host.groups))
    return HostTls(ensure(wanted), cert)
