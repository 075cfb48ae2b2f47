"""How a host is reached: one owner for the address, the port and the user, asked two genuinely different ways.

- From the controller (`ssh_address`, `ssh_command`, `api_url`, `front_door_url`): where the controller opens SSH
  to a host, and where it asks the host's API or a front door over HTTP when no `controller_*_url` says
  otherwise. That is pyinfra's own rule: `ssh_hostname` where the inventory sets one, else the host's name in
  the inventory (an inventory of bare addresses, `sparks = ["10.0.0.11", ...]`, names each host by its
  address). The controller may sit elsewhere than the LAN (a tunnel, the simulator's published ports), so its
  address is not the LAN's.
- From the other hosts on the LAN (`lan_address`): where a peer fetches the model share, where the front door's
  server lines, Prometheus's targets and preflight's reach checks point. The host's `lan_address` setting where
  set, else where the controller reaches it.

Pure functions of the inventory's merged data (and the host's Settings): no I/O, no pyinfra.
"""

from __future__ import annotations

import ipaddress

from sparkfleet.contract.settings import Settings
from sparkfleet.refused import Refused


def ssh_address(name: str, data: dict) -> str:
    """The address the controller reaches host `name` at (SSH, and HTTP without a `controller_*_url`):
    `ssh_hostname`, else the inventory's name, as pyinfra connects."""
    return str(data.get("ssh_hostname") or name)


def lan_address(name: str, data: dict, s: Settings) -> str:
    """The address the other hosts on the LAN reach host `name` at: its `lan_address` setting, else
    `ssh_address` (the controller and the hosts share one network unless the inventory says otherwise)."""
    return s.lan_address or ssh_address(name, data)


def http_url(address: str, port: int, scheme: str = "http") -> str:
    """`scheme://address:port`, an IPv6 address in brackets (RFC 3986)."""
    try:
        host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    except ValueError:
        host = address
    return f"{scheme}://{host}:{int(port)}"


def api_reachable(s: Settings) -> bool:
    """Whether the controller asks a host's API over HTTP: a `controller_api_url`, or an API that listens beyond
    loopback. Else `status` asks it on the host over SSH, and the speed gate through an SSH forward."""
    return bool(s.controller_api_url) or not s.api_is_loopback


def api_url(name: str, s: Settings, data: dict, tls: bool = False) -> str | None:
    """Where the controller reaches a host's API (status, bench, the speed gate), or None when it listens on
    loopback only (`api_reachable`). `tls`: the fleet's guards serve TLS (fleet/tls.py `guard_client`), so a
    `controller_api_url` given as http:// is asked over https all the same (the guard speaks nothing else)."""
    if s.controller_api_url:
        url = s.controller_api_url.rstrip("/")
        return "https://" + url.removeprefix("http://") if tls and url.startswith("http://") else url
    if not api_reachable(s):
        return None
    return http_url(ssh_address(name, data), s.api_port, "https" if tls else "http")


def front_door_url(name: str, s: Settings, data: dict) -> str:
    """Where the controller reaches the front door on host `name` (status, usage, bench --front-door)."""
    if s.controller_front_door_url:
        return s.controller_front_door_url.rstrip("/")
    return http_url(ssh_address(name, data), s.front_door_port, "https" if s.front_door_tls_cert else "http")


def clients_url(name: str, s: Settings, data: dict) -> str:
    """Where the office's clients reach the front door: the doors' floating address where they share one (whichever
    door holds it answers), else the door itself as the controller reaches it (`front_door_url`)."""
    if not s.front_door_address:
        return front_door_url(name, s, data)
    ip = str(ipaddress.ip_interface(s.front_door_address).ip)
    return http_url(ip, s.front_door_port, "https" if s.front_door_tls_cert else "http")


def _option_value(value: str) -> str:
    """A value for `ssh -o KEY=VALUE`, which ssh splits on blanks itself: quoted when it holds one."""
    if any(c.isspace() or c in "\"\\'" for c in value):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return value


def ssh_port(name: str, data: dict) -> int | None:
    """The inventory's `ssh_port` (None: ssh's own), refused in one line unless it is a TCP port."""
    value = data.get("ssh_port")
    if value is None or value == "":
        return None
    text = str(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else ""
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= 65535:
        raise Refused(f"{name}: `ssh_port` = {value!r} is not a TCP port (1-65535): fix it in the inventory")
    return int(text)


def _ssh_value(name: str, key: str, value) -> str:
    """An inventory value for ssh's command line: refused in one line if it holds a control character (a line
    break would be a second line of ssh's -o config, an escape would reach the terminal in ssh's errors)."""
    text = str(value)
    if not all(c.isprintable() or c == " " for c in text):
        raise Refused(f"{name}: `{key}` = {text!r} holds a control character: fix it in the inventory")
    return text


SSH_CONNECT_TIMEOUT_S = 10  # OpenSSH's ConnectTimeout: the TCP connect and the banner exchange (pyinfra's is 10 s too)


def ssh_command(name: str, data: dict, *options: str) -> list[str]:
    """OpenSSH's command line to host `name` with the inventory's SSH settings (port, user, key, config file,
    host-key policy and known_hosts), `options` first, ending `-- ADDRESS` (never read as an option): the
    caller appends a remote command, or none. Each value is its own option's argument (a control character or
    a port that is none: refused). An argument list, no shell; a key file is named, never read.

    Always with a connect timeout (`SSH_CONNECT_TIMEOUT_S`, which also bounds a port that accepts and never sends
    a banner); a caller's own `-o ConnectTimeout=` in `options` comes first, and OpenSSH keeps the first value."""
    argv = ["ssh", *options]
    port = ssh_port(name, data)
    if port is not None:
        argv += ["-p", str(port)]
    for key, flag in (("ssh_user", "-l"), ("ssh_key", "-i"), ("ssh_config_file", "-F")):
        if data.get(key):
            argv += [flag, _ssh_value(name, key, data[key])]
    for key, word in (("ssh_strict_host_key_checking", "StrictHostKeyChecking"),
                      ("ssh_known_hosts_file", "UserKnownHostsFile")):
        if data.get(key):
            argv += ["-o", f"{word}={_option_value(_ssh_value(name, key, data[key]))}"]
    argv += ["-o", f"ConnectTimeout={SSH_CONNECT_TIMEOUT_S}"]
    return [*argv, "--", _ssh_value(name, "ssh_hostname (or the host's name)", ssh_address(name, data))]
