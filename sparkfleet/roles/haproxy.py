"""What the front door and the per-host guard share: one HAProxy hardening (global section, defaults, unit),
the paths each kind of engine serves, and the check that every value rendered into a config is a token of
HAProxy's grammar (an address with a newline would add a line of config)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from sparkfleet.contract import paths
from sparkfleet.release import render

# The OpenAI paths the fleet serves, per kind of engine; a guard adds /metrics (the controller's status and
# bench read it with the backend key), nothing else reaches an engine from the LAN.
API_PATHS = {
    "chat": ("/v1/models", "/v1/chat/completions", "/v1/completions"),
    "embedding": ("/v1/models", "/v1/embeddings"),
    "reranker": ("/v1/models", "/v1/rerank", "/v1/score"),
}
HEALTH = "/health"
METRICS = "/metrics"
USER = "haproxy"  # Debian's package creates it and its empty chroot (paths.HAPROXY_CHROOT)
UNIT_TEMPLATE = "sparkfleet-haproxy.service.j2"
AUTH_401 = ('\'{"error":{"message":"invalid or missing API key","type":"AuthenticationError","code":401}}\'')
# Fair share's refusals (the openai client raises RateLimitError on 429)
RATE_429 = ('\'{"error":{"message":"too many requests a minute for this user: retry after 60 s",'
            '"type":"RateLimitError","code":429}}\'')
AT_ONCE_429 = ('\'{"error":{"message":"too many requests at once for this user: retry after 1 s",'
               '"type":"RateLimitError","code":429}}\'')
NOT_FOUND_404 = '\'{"error":{"message":"not found","type":"NotFoundError","code":404}}\''
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/+-]*")
# A server's name in a backend (an inventory host name): what the front door's config, its runtime commands
# (`set server BACKEND/NAME`) and its records (drained, held) all take.
SERVER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}")


@dataclass(frozen=True)
class Limits:
    """One HAProxy's bounds: connections (global and per frontend), its buffer, its unit's memory cap."""

    maxconn: int
    bufsize: int
    memory_max: str


def token(value: str, what: str) -> str:
    """`value` as one HAProxy word (server names, served names, paths): letters, digits and _ . : / + -."""
    if not _TOKEN.fullmatch(value):
        raise ValueError(f"{what} {value!r} must be letters, digits and _ . : / + - to go into HAProxy's config")
    return value


def address(value: str, port: int) -> str:
    """`host:port` for a `bind` or `server` line: an IP address (IPv6 in brackets) or a host name, nothing else."""
    try:
        ip = ipaddress.ip_address(value)
        return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
    except ValueError:
        pass
    labels = value.split(".")
    if len(value) > 253 or not all(re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?", x) for x in labels):
        raise ValueError(f"address {value!r} must be an IP address or a host name (letters, digits, '-', '.')")
    return f"{value}:{port}"


def config(template: str, limits: Limits, **values) -> str:
    """One HAProxy config from its template, with the shared hardening's values (see haproxy-global.cfg.j2)."""
    return render._templates.get_template(template).render(
        limits=limits, user=USER, chroot=paths.HAPROXY_CHROOT, health=HEALTH, auth_401=AUTH_401,
        not_found_404=NOT_FOUND_404, **values)


def unit(description: str, config: str, runtime_dir: str, limits: Limits, state_dir: str | None = None,
         save_state: str | None = None, replay: str | None = None, save_usage: str | None = None,
         secrets: str | None = None) -> str:
    """The systemd unit of one HAProxy (front door or guard): checked config, reload without drops, sandboxed.

    `save_state` (run before each reload) and `replay` (run once it serves after a start) are shell lines for
    `sh -c '...'`: no single quote, and no `$`, `%` or backslash, which systemd would expand itself; `save_usage`
    (before each reload and at a stop) is a command line of the same characters. `secrets`: a 0600 config file
    read before the config (its `setenv` lines), at every check, start and reload.
    """
    for line in (save_state, replay, save_usage):
        if line and set(line) & set("'$%\\"):
            raise ValueError(f"unit command {line!r} holds a character systemd or sh -c '...' would change")
    return render._templates.get_template(UNIT_TEMPLATE).render(
        description=description, config=config, runtime_dir=runtime_dir, state_dir=state_dir,
        save_state=save_state, replay=replay, save_usage=save_usage, memory_max=limits.memory_max,
        secrets=f"-f {secrets} " if secrets else "")


def fleet_tls() -> str:
    """The options of a TLS hop to a guard (a door's backends, its chat UI): TLS, the other end's chain verified
    against the fleet CA, this host's certificate presented (its key loaded from beside it). The doors' peers link
    trusts only the doors instead (roles/front_door/address.py `peers_tls`)."""
    return f"ssl verify required ca-file {paths.TLS_CA} crt {paths.TLS_HOST_CERT}"
