"""Typed, validated settings: what a host's data must look like.

pyinfra merges `--data` > host > group > all; this module checks the merged
result before any host is touched, and names the host, the problem and the fix.
Every value that reaches a shell, a unit, a path or a URL has a type below
with its grammar, so nothing a setting holds can change the meaning of the
command, unit line or file it lands in. The defaults live in one place,
group_data/all.py, merged under the host's data here as well, so a project
that uses sparkfleet without this repository's group_data still gets them.
"""

from __future__ import annotations

import difflib
import ipaddress
import posixpath
import re
import runpy
import unicodedata
from functools import lru_cache
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    create_model,
)
from pydantic_core import ErrorDetails

from sparkfleet import DEFAULTS_FILE
from sparkfleet.contract.engines import ADMIN_ENV, ENGINES, VERSION_SETTINGS
from sparkfleet.contract.recipes import catalogue, neutral_settings
from sparkfleet.refused import Refusal

# Every setting's bounds beyond its type: no string longer, no list or dict larger, anywhere in a value
# (`_oversized`); no context longer than MAX_CONTEXT tokens.
MAX_TEXT = 4096
MAX_ITEMS = 10_000
MAX_CONTEXT = 2**24
# Keys owned by pyinfra's connectors, not by sparkfleet.
CONNECTION_PREFIXES = ("ssh_", "winrm_", "chroot_", "docker_identifier", "local_", "fake_", "_")
# In a host's data: the keys its inventory entry, its groups or `--data` set (fleet.inventory.host_data
# adds it); they win over the recipe even where they equal a default.
USER_SET_KEY = "_sparkfleet_user_set"
# In a host's data: its inventory groups (fleet.inventory.host_data adds it): a service host is told by them.
GROUPS_KEY = "_sparkfleet_groups"


class SettingsError(ValueError, Refusal):
    """One or more hosts have settings that cannot work; each line names a fix. A refusal (sparkfleet/refused.py):
    a command prints it under "invalid settings:" and exits 2.

    `problems` keeps one line per host; the message says each problem once, naming every host it applies to
    (a default that is wrong for the fleet would otherwise repeat once per Spark)."""

    heading: str | None = "invalid settings"

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(group_problems(problems)))


def group_problems(problems: list[str]) -> list[str]:
    """"a: X", "b: X", "a: Y" -> "a, b: X", "a: Y": lines that differ only in their host, once, in first-seen
    order. A line whose prefix is not one word (a host name) is kept as it is, once."""
    hosts: dict[str, list[str]] = {}
    for line in problems:
        host, sep, rest = line.partition(": ")
        key, who = (rest, host) if sep and host and not any(c.isspace() for c in host) else (line, None)
        named = hosts.setdefault(key, [])
        if who is not None and who not in named:
            named.append(who)
    return [f"{', '.join(named)}: {key}" if named else key for key, named in hosts.items()]


# --- One type per kind of value ---------------------------------------------


def _one_line(value: str) -> str:
    """A control character (newline, CR, NUL, ...) would end or split the unit line, env line or command."""
    for char in value:
        if unicodedata.category(char) in ("Cc", "Zl", "Zp"):
            raise ValueError(f"contains the control character U+{ord(char):04X}: remove it")
    return value


def _grammar(pattern: str, what: str):
    """A validator that accepts exactly `pattern` (ASCII, whole string) and otherwise says `what` is expected."""
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if len(value) > 255 or not compiled.fullmatch(value):
            raise ValueError(f"must be {what}, at most 255 characters")
        return value

    return AfterValidator(check)


_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def _host(value: str) -> str:
    """An IP address or an RFC 1123 host name: safe unquoted in URLs, command lines and units."""
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if len(value) > 253 or not all(_LABEL.fullmatch(label) for label in value.split(".")):
        raise ValueError("must be an IP address or a host name (letters, digits, '-', '.')")
    return value


_PATH = re.compile(r"[A-Za-z0-9._+@= /-]+")


def _abs_path(value: str) -> str:
    """Absolute and normalised, so it names one place; no ':' (docker --volume), '%' or '$' (systemd)."""
    if (not _PATH.fullmatch(value) or not value.startswith("/") or value.startswith("//") or value == "/"
            or posixpath.normpath(value) != value
            or any(part != part.strip() for part in value.split("/"))):
        raise ValueError("must be an absolute, normalised path below / (no '..', '//', trailing '/', or space "
                         "around a '/'), of letters, digits, spaces and . _ + @ = -")
    return value


def _eval_interval(value: int) -> int:
    """The periodic eval: off (0), or at least an hour apart, so the probes never crowd the colleagues' requests."""
    if 0 < value < 3600:
        raise ValueError("must be 0 (off) or at least 3600 seconds (an hour between a host's evaluations)")
    return value


_URL_PATH = re.compile(r"[A-Za-z0-9._~/+-]*")


def _url(value: str, placeholder: str | None = None) -> str:
    """http(s)://host[:port][/path]: no credentials, query or fragment, so it is safe to print and to paste."""
    fix = "must be an http(s) URL: http[s]://HOST[:PORT][/PATH], without user:password@, '?' or '#'"
    parts = urlsplit(value)
    try:
        port = parts.port
        _host(parts.hostname or "")
    except ValueError:
        raise ValueError(fix) from None
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
    path = parts.path.replace(placeholder, "") if placeholder else parts.path
    if (parts.scheme not in ("http", "https") or parts.netloc.lower() != f"{host}{f':{port}' if port else ''}"
            or "?" in value or "#" in value or not _URL_PATH.fullmatch(path)):
        raise ValueError(fix + (f"; only {placeholder} may be in braces" if placeholder else ""))
    return value


def _ipv4(value: str) -> str:
    """A unicast IPv4 address written the usual way (a fabric member's: Ray, NCCL and ping are given it)."""
    try:
        address = ipaddress.IPv4Address(value)
    except ValueError:
        raise ValueError("must be an IPv4 address such as 192.168.100.1") from None
    if str(address) != value or address.is_unspecified or address.is_multicast or address.is_loopback:
        raise ValueError("must be this member's unicast IPv4 address on the fabric, such as 192.168.100.1")
    return value


def _floating_address(value: str) -> str:
    """The front doors' floating IPv4 address with its network's prefix (10.0.0.100/24): keepalived adds it to the
    interface whose network holds it, and the prefix is how that network is told. Not the network's own address
    or its broadcast address (no host answers those), not loopback, multicast or link-local, not IPv6 (VRRPv2)."""
    fix = "must be the doors' floating IPv4 address with its network's prefix, such as 10.0.0.100/24"
    try:
        iface = ipaddress.IPv4Interface(value)
    except ValueError:
        raise ValueError(f"{fix} (IPv6 is not supported: VRRP here is version 2)" if ":" in value else fix) from None
    ip, net = iface.ip, iface.network
    if str(iface) != value or "/" not in value:
        raise ValueError(fix + ", written as `ip addr` writes it")
    if ip.is_loopback or ip.is_multicast or ip.is_link_local or ip.is_unspecified or not 8 <= net.prefixlen <= 30:
        raise ValueError(fix + ": a unicast LAN address in a network of /8 to /30")
    if ip in (net.network_address, net.broadcast_address):
        raise ValueError(f"{ip} is the network's own or its broadcast address of {net}: choose a host address in it")
    return value


def _arch_url(value: str) -> str:
    """The toolkit's apt URL: `{arch}` becomes the host's Debian architecture."""
    return _url(value, "{arch}")


# Docker's reference grammar (distribution/reference), digests limited to sha256.
_REF_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_DOMAIN = rf"(?:{_REF_LABEL}(?:\.{_REF_LABEL})*|\[[0-9A-Fa-f:]+\])"  # brackets: an IPv6 address (Docker's)
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(rf"(?:{_DOMAIN}(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*"
                    rf"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?(?:@sha256:[0-9a-f]{{64}})?")


def _image(value: str) -> str:
    """An image Docker parses as one reference (never an option: it starts with a letter or digit)."""
    if len(value) > 255 or not _IMAGE.fullmatch(value) or re.fullmatch(r"[0-9a-f]{64}(?:[:@].*)?", value):
        raise ValueError("must be a Docker image reference: [REGISTRY[:PORT]/]NAME[:TAG][@sha256:<64 hex>] "
                         "(NAME lower-case, not 64 hex digits)")
    return value


def _engine_env_name(value: str) -> str:
    """An engine_env key that opens an engine's admin surface (ADMIN_ENV: each engine's descriptor's admin_env) is
    refused with the reason, whatever its value and whichever engine the host runs (the value is never shown)."""
    if value in ADMIN_ENV:
        raise ValueError(f"{value} {ADMIN_ENV[value]}: remove it from engine_env")
    return value


def _fingerprint(value: Any) -> Any:
    return value.replace(" ", "").upper() if isinstance(value, str) else value


Text = Annotated[str, AfterValidator(_one_line)]
Name = Annotated[Text, _grammar(r"[A-Za-z0-9][A-Za-z0-9_.-]*", "a name of letters, digits and _ . - "
                                                               "(starting with a letter or digit)")]
ServedName = Annotated[Text, _grammar(r"[A-Za-z0-9][A-Za-z0-9_.:/+-]*",
                                      "a model name of letters, digits and _ . : / + -")]
RepoId = Annotated[Text, _grammar(r"(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*",
                                  "a hub repository id: OWNER/NAME")]
Revision = Annotated[Text, _grammar(r"(?!.*\.\.)(?!.*//)[A-Za-z0-9][A-Za-z0-9_./-]*",
                                    "a branch, tag or commit of the hub repository")]
Version = Annotated[Text, _grammar(r"[0-9]+(?:\.[0-9A-Za-z]+)*", "a dotted version such as 13.0 or 580.95.05")]
DebVersion = Annotated[Text, _grammar(r"(?:[0-9]+:)?[0-9][A-Za-z0-9.+~-]*", "a Debian package version "
                                                                           "such as 1.18.1-1")]
PackageName = Annotated[Text, _grammar(r"[a-z0-9][a-z0-9+.-]+", "a Debian package name such as "
                                                                "nvidia-driver-580-open")]
VersionGlob = Annotated[Text, _grammar(r"[0-9A-Za-z.+~:*?-]+", "a version or a glob of one (fnmatch: * and ?), "
                                                               "such as 7.0.0-1019*, 580.95.* or 5:27.*")]
Fingerprint = Annotated[str, BeforeValidator(_fingerprint), _grammar(
    r"[0-9A-F]{40}", "a 40-hex-digit OpenPGP fingerprint (gpg --show-keys prints it)")]
# A glob of a model repository's file paths (fnmatch), e.g. "*Q4_K_M*.gguf": never a path that climbs out.
FileGlob = Annotated[Text, _grammar(r"(?!.*\.\.)(?!/)[A-Za-z0-9_.*?/-]+", "a glob of repository file paths "
                                                                   "(letters, digits, _ . - / * ?, no '..')")]
EnvName = Annotated[Text, _grammar(r"[A-Z_][A-Z0-9_]*", "an environment variable name: [A-Z_][A-Z0-9_]*")]
EngineEnvName = Annotated[EnvName, AfterValidator(_engine_env_name)]
Token = Annotated[Text, _grammar(r"[!-~]+", "printable ASCII without spaces")]
# The engines' key: a Token without commas (HAProxy's header fetches read a comma as a list of values).
ApiKey = Annotated[Text, _grammar(r"[!-+\--~]+", "printable ASCII without spaces or commas")]
UserKey = Annotated[Text, _grammar(r"[A-Za-z0-9._~+/=-]{16,}", "at least 16 of letters, digits and . _ ~ + / = -")]
Host = Annotated[Text, AfterValidator(_host)]
IPv4 = Annotated[Text, AfterValidator(_ipv4)]
# A Linux interface name (IFNAMSIZ: 15 bytes), never an option: it lands in `ip`, `ping -I` and NCCL's variables.
InterfaceName = Annotated[Text, _grammar(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,14}",
                                         "a network interface name of at most 15 letters, digits and _ . : - "
                                         "(starting with a letter or digit), as `ip link` lists it")]
AbsPath = Annotated[Text, AfterValidator(_abs_path)]
FloatingAddress = Annotated[Text, AfterValidator(_floating_address)]
Url = Annotated[Text, AfterValidator(_url)]
ArchUrl = Annotated[Text, AfterValidator(_arch_url)]
ImageRef = Annotated[Text, AfterValidator(_image)]
# restic's repository forms an office may name (no credentials in it: those stay in files, never a command line)
BackupRepository = Annotated[Text, _grammar(
    r"sftp:[A-Za-z0-9][A-Za-z0-9_.-]*@[A-Za-z0-9_.:\[\]-]+:/[A-Za-z0-9_./-]*"
    r"|rest:https?://[A-Za-z0-9_.:\[\]-]+(/[A-Za-z0-9_./-]*)?"
    r"|s3:(https?://)?[A-Za-z0-9_.:\[\]-]+/[A-Za-z0-9_./-]+",
    "a restic repository without credentials: sftp:USER@HOST:/PATH, rest:https://HOST:PORT/PATH or "
    "s3:HOST/BUCKET")]


def _secret():
    """A secret setting: never in repr, never echoed in an error."""
    return Field(repr=False, json_schema_extra={"secret": True})


class FrontDoorUser(BaseModel):
    """A front door user: their key and, where set, limits of their own (else the fleet-wide
    front_door_requests_per_minute and front_door_max_concurrent). A plain key string stands for {key}."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, hide_input_in_errors=True)

    key: UserKey = _secret()
    requests_per_minute: int | None = Field(default=None, ge=1, le=1_000_000)
    max_concurrent: int | None = Field(default=None, ge=1, le=100_000)


def _user_entry(value: Any) -> Any:
    """A user's value may stay a key string: it becomes {key: value} (limits from the fleet-wide defaults)."""
    return {"key": value} if isinstance(value, str) else value


UserEntry = Annotated[FrontDoorUser, BeforeValidator(_user_entry)]


ServiceName = Annotated[str, _grammar(r"[a-z][a-z0-9-]{0,30}", "a service name: lower-case letters, digits and '-', "
                                                              "starting with a letter, at most 31 characters")]


# A service entry's engine versions (vllm_version, llamacpp_version, ...): a chat service on an engine of its own.
# The engines' names and version fields are made from contract/engines.py at import: mypy sees a plain model and
# names (their readers use getattr with the descriptor's version_setting).
if TYPE_CHECKING:
    _ServiceVersions = BaseModel
    EngineName = str
else:
    _ServiceVersions = create_model("_ServiceVersions", **{name: (Version | None, None) for name in VERSION_SETTINGS})
    EngineName = Literal[ENGINES]


class Service(_ServiceVersions):
    """One model beside the chat model (embeddings, rerank, another chat model): a service entry over its
    recipe's settings.

    Each key left out comes from the recipe (`recipes/<recipe>.toml`, [settings]); the planner merges the two
    and checks the result, so only `recipe` is required here. The engine keys (`engine`, `engine_image`, its
    version, `model_files`) are a chat service's: one of another engine or image than the host's.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, hide_input_in_errors=True)

    recipe: Name
    model_repo: RepoId | None = None
    model_revision: Revision | None = None
    served_model_name: ServedName | None = None
    api_port: int | None = Field(default=None, ge=1, le=65535)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    kv_cache_memory_bytes: int | None = Field(default=None, ge=2**20, le=2**50)
    max_model_len: int | None = Field(default=None, gt=0, le=MAX_CONTEXT)
    hf_overrides: dict[Name, JsonValue] | None = None  # vLLM's --hf-overrides: config.json keys, as JSON
    extra_engine_args: list[Text] = []
    # started by the first request that names it, stopped after on_demand_idle_s without one (docs/several-models.md)
    on_demand: bool = False
    on_demand_idle_s: int | None = Field(default=None, ge=10, le=7 * 86400)
    engine: EngineName | None = None
    engine_image: ImageRef | None = None
    model_files: list[FileGlob] | None = None


# Each engine's version setting (contract/engines.py `version_setting`: vllm_version, sglang_version, ...), the
# version whose flag table its arguments are checked against; their defaults are in group_data/all.py.
if TYPE_CHECKING:
    _EngineVersions = BaseModel
else:
    _EngineVersions = create_model("_EngineVersions", **{name: (Version, ...) for name in VERSION_SETTINGS})


class Settings(_EngineVersions):
    """Every setting sparkfleet reads; the defaults live in group_data/all.py (see `defaults`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, hide_input_in_errors=True)

    expected_arch: Name
    expected_gpu_name: Text
    min_driver_version: Version
    min_cuda_version: Version
    # None: preflight's floor follows host_memory_gb (host/preflight.py)
    min_memory_gib: float | None = Field(ge=0, le=1024)
    service_min_memory_gib: float = Field(ge=0, le=1024)
    service_min_disk_gib: float = Field(ge=0, le=1_000_000)
    refused_kernels: dict[VersionGlob, Text]
    refused_pair_kernels: dict[VersionGlob, Text]
    refused_drivers: dict[VersionGlob, Text]
    platform_pins: dict[PackageName, VersionGlob]

    toolkit_repo_url: ArchUrl
    toolkit_key_url: Url
    toolkit_key_fingerprint: Fingerprint
    toolkit_version: DebVersion | None
    min_toolkit_version: DebVersion

    recipe: Annotated[Text, _grammar(r"[a-z0-9][a-z0-9.-]*", "a recipe name (lowercase letters, digits, . -)")]
    model_hub: Literal["modelscope", "huggingface"]
    model_repo: RepoId
    model_revision: Revision
    hub_endpoint: Url | None
    controller_hub_endpoint: Url | None
    hub_token: Token | None = _secret()
    model_root: AbsPath
    full_verify: bool
    model_source: Literal["hub", "peer", "controller"]
    peer_port: int = Field(ge=1, le=65535)
    lan_address: Host | None
    keep_releases: int = Field(ge=2, le=100)
    controller_model_dir: AbsPath | None
    engine_image_archive: AbsPath | None
    controller_registry_url: Url | None

    engine: EngineName  # contract/engines.py: each engine's version setting is a field of _EngineVersions
    engine_image: ImageRef
    model_files: list[FileGlob] | None
    expected_concurrency: int | None = Field(ge=1, le=100_000)
    served_model_name: ServedName
    api_host: Host
    api_port: int = Field(ge=1, le=65535)
    api_key: ApiKey | None = _secret()
    allow_unauthenticated_api: bool
    controller_api_url: Url | None
    max_model_len: int = Field(gt=0, le=MAX_CONTEXT)
    gpu_memory_utilization: float = Field(gt=0, le=1)
    kv_cache_memory_bytes: int | None = Field(ge=2**20, le=2**50)
    enable_prefix_caching: bool
    enable_auto_tool_choice: bool
    tool_call_parser: Name | None
    reasoning_parser: Name | None
    attention_backend: Name | None
    limit_mm_per_prompt: dict[Name, Annotated[int, Field(ge=0, le=1024)]] | None  # items per prompt: 0 turns one off
    kv_cache_dtype: Name
    max_num_seqs: int | None = Field(gt=0, le=65536)
    tensor_parallel_size: int = Field(ge=1, le=64)
    # Two or more Sparks serving one model over Ray (vLLM's multi-node path); the first name is the head.
    tensor_parallel_hosts: list[Name]
    fabric_interface: InterfaceName
    fabric_address: IPv4 | None
    fabric_mtu: int = Field(ge=1280, le=9216)
    ray_port: int = Field(ge=1, le=65535)
    ray_start_args: list[Text]
    speculative_method: Literal["mtp"] | None  # the model's own MTP layer(s) draft; None: no speculative decoding
    num_speculative_tokens: int | None = Field(ge=1, le=8)
    extra_engine_args: list[Text]
    engine_env: dict[EngineEnvName, Text] = _secret()
    sim_engine_knobs: bool  # the simulator's inventories alone: engine_env may set its stand-ins' SIM_* knobs
    allow_trust_remote_code: bool

    services: dict[ServiceName, Service]
    gpu_memory_budget: float = Field(gt=0, le=1)
    on_demand_idle_s: int = Field(ge=10, le=7 * 86400)
    on_demand_max_waiting: int = Field(ge=1, le=4096)
    # how long an on-demand engine serves before another's start may stop it for room (0: at once); an hour at most
    on_demand_min_resident_s: int = Field(ge=0, le=3600)

    host_memory_gb: float = Field(ge=1, le=1024)  # GB of the host's (unified) memory the fit plans in
    memory_bandwidth_gbs: float = Field(gt=0, le=100_000)

    container_name: Name
    docker_network: Name
    privileged: bool
    seccomp_unconfined: bool
    gpu_device_mode: Literal["runtime", "cdi"]
    start_timeout_s: int = Field(gt=0, le=86400)
    health_timeout_s: int = Field(gt=0, le=86400)
    watchdog: bool
    watchdog_interval_s: int = Field(ge=5, le=3600)
    watchdog_failures: int = Field(ge=1, le=100)
    watchdog_max_restarts: int = Field(ge=1, le=100)
    watchdog_window_s: int = Field(ge=60, le=7 * 86400)
    front_door_port: int = Field(ge=1, le=65535)
    front_door_users: dict[Name, UserEntry] = _secret()
    front_door_requests_per_minute: int | None = Field(ge=1, le=1_000_000)
    front_door_max_concurrent: int | None = Field(ge=1, le=100_000)
    controller_front_door_url: Url | None
    controller_front_door_ca: AbsPath | None
    front_door_tls_cert: AbsPath | None
    front_door_tls_key: AbsPath | None
    front_door_allow_http: bool
    front_door_routing: Literal["bounded", "hash", "roundrobin"]  # the door's choice of engine (roles/front_door)
    fleet_ca_cert: AbsPath | None  # the fleet CA on the controller (roles/pki.py): TLS on every backend hop
    fleet_ca_key: AbsPath | None
    backend_key_in_clear: bool
    front_door_viewers: dict[Name, UserKey] = _secret()
    drain_timeout_s: int = Field(ge=0, le=3600)
    # Two or more front doors sharing one address (keepalived's VRRP, HAProxy's peers): roles/front_door/address.py
    front_door_address: FloatingAddress | None
    front_door_address_preempt: bool
    front_door_vrrp_unicast: bool
    front_door_vrrp_router_id: int | None = Field(ge=1, le=255)
    front_door_peers_port: int = Field(ge=1, le=65535)
    # The chat UI (Open WebUI) on the host of the group chat_ui, reached only through the front doors
    chat_ui_image: ImageRef
    chat_ui_port: int = Field(ge=1, le=65535)
    chat_ui_host_port: int = Field(ge=1, le=65535)
    rollout_max_regression: float = Field(ge=0, lt=1)
    # answer quality (fleet/quality.py, docs/quality.md): the probe suite (None: the packaged one), the score's
    # margin under the baseline, the periodic eval's interval (0: off; else at least an hour: colleagues come first)
    quality_probes: Annotated[Text, _grammar(r"[A-Za-z0-9._+@= /-]+", "a probe file's path (absolute, or the "
                                             "project's) of letters, digits, spaces and . _ + @ = - /")] | None
    quality_margin: float = Field(ge=0, lt=1)
    quality_eval_interval_s: Annotated[int, Field(ge=0, le=30 * 86400), AfterValidator(_eval_interval)]
    # backups (contract/backup.py, docs/backups.md): to the host of the group backup, or an office's own repository
    backup_repository: BackupRepository | None
    backup_interval_s: int = Field(ge=300, le=7 * 86400)
    backup_keep_hourly: int = Field(ge=0, le=10_000)
    backup_keep_daily: int = Field(ge=0, le=10_000)
    backup_keep_weekly: int = Field(ge=0, le=10_000)
    controller_backup_password_file: AbsPath | None  # the office's one backup password (0600, `sparkfleet init`)
    monitoring_port: int = Field(ge=1, le=65535)
    monitoring_retention: Annotated[Text, _grammar(r"[1-9][0-9]{0,5}(h|d|w|y)", "a retention: a number and h, d, "
                                                                               "w or y (e.g. 15d)")]
    monitoring_scrape_interval_s: int = Field(ge=5, le=300)
    monitoring_down_for_s: int = Field(ge=0, le=86400)
    monitoring_alert_for_s: int = Field(ge=0, le=86400)
    monitoring_kv_cache_max: float = Field(gt=0, le=1)
    monitoring_waiting_requests_max: int = Field(ge=0, le=1_000_000)
    monitoring_min_sm_clock_mhz: int = Field(ge=0, le=10000)
    monitoring_drained_max_s: int = Field(ge=60, le=7 * 86400)
    alertmanager_port: int = Field(ge=1, le=65535)
    alertmanager_webhook_url: Url | None = _secret()

    @property
    def api_is_loopback(self) -> bool:
        if self.api_host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.api_host).is_loopback
        except ValueError:
            return False

    @property
    def front_door_keys(self) -> dict[str, str]:
        """{user name: key} of the front door's users."""
        return {name: user.key for name, user in self.front_door_users.items()}

    def front_door_limits(self) -> dict[str, tuple[int | None, int | None]]:
        """{user name: (requests per minute, concurrent requests)}: the user's own, else the fleet-wide default;
        None is no limit."""
        return {name: (u.requests_per_minute or self.front_door_requests_per_minute,
                       u.max_concurrent or self.front_door_max_concurrent)
                for name, u in self.front_door_users.items()}

    @property
    def controller_endpoint(self) -> str | None:
        """The hub URL the controller uses; hosts use hub_endpoint."""
        return self.controller_hub_endpoint or self.hub_endpoint


SECRET_SETTINGS = frozenset(name for name, field in Settings.model_fields.items()
                            if isinstance(field.json_schema_extra, dict) and field.json_schema_extra.get("secret"))


@lru_cache(maxsize=1)
def defaults() -> dict[str, Any]:
    """The public names of group_data/all.py: the one place a default is written."""
    return {key: value for key, value in runpy.run_path(str(DEFAULTS_FILE)).items()
            if not key.startswith("_") and not isinstance(value, ModuleType)}


def _oversized(value: Any, depth: int = 0) -> str | None:
    """Why a setting's value is too big for any setting (every setting, whatever its type: a string over MAX_TEXT
    characters, a list or dict over MAX_ITEMS items, nested deeper than 8, anywhere in it), or None."""
    if depth > 8:
        return "is nested more than 8 deep"
    if isinstance(value, str):
        return f"is {len(value):,} characters long: at most {MAX_TEXT:,}" if len(value) > MAX_TEXT else None
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        if len(value) > MAX_ITEMS:
            return f"holds {len(value):,} items: at most {MAX_ITEMS:,}"
        items = [*value.keys(), *value.values()] if isinstance(value, dict) else list(value)
        return next((why for why in (_oversized(item, depth + 1) for item in items) if why), None)
    return None


def _shown(value: Any, form=repr, limit: int = 80) -> str:
    """A value quoted back in a refusal, cut where long: a line never echoes 100,000 characters."""
    text = form(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def _did_you_mean(key: str, known=Settings.model_fields,
                  fallback: str = "see group_data/all.py for the known settings") -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f"did you mean `{close[0]}`?" if close else fallback


def _is_connection_key(key: str) -> bool:
    return key.startswith(CONNECTION_PREFIXES)


def _problem(host_name: str, err: ErrorDetails) -> str:
    """One line for one pydantic error: the host, the key, what is wrong and the fix; a secret is never shown.

    An item of a list or dict is named by its position, not echoed: only a whole
    non-secret value is quoted back (repr, so a control character shows as an escape).
    """
    setting, *inside = err["loc"]
    key = str(setting) + "".join(f"[{part!r}]" if part != "[key]" else " (key)" for part in inside)
    if err["type"] == "extra_forbidden" and setting == "services" and len(inside) == 2:
        knows = "a service knows " + ", ".join(Service.model_fields)
        return (f"{host_name}: unknown key `{inside[1]}` in service {inside[0]!r} (setting `services`): "
                f"{_did_you_mean(str(inside[1]), Service.model_fields, knows)}")
    if err["type"] == "extra_forbidden":
        return f"{host_name}: unknown setting `{_shown(key, str)}`: {_did_you_mean(key)}"
    if err["type"] == "missing":
        return f"{host_name}: setting `{key}` is missing: set it in {'that entry' if inside else 'group_data/all.py'}"
    shown = "" if setting in SECRET_SETTINGS or inside else f" = {_shown(err['input'])}"
    reason = err["msg"].removeprefix("Value error, ")
    return f"{host_name}: setting `{key}`{shown} is invalid: {reason}; fix it in the inventory or group_data"


def user_set(data: dict[str, Any]) -> dict[str, Any]:
    """The settings of `data` that the user set: named in USER_SET_KEY, unknown to the defaults, or not equal to
    the default (group_data/all.py is merged into every host's data, so an equal value there is the default)."""
    base, named = defaults(), set(data.get(USER_SET_KEY, ()))
    return {k: v for k, v in data.items() if not _is_connection_key(k)
            and (k in named or k not in base or v != base[k])}


def recipe_settings(host_name: str, name: Any, model_repo: Any = None) -> dict[str, Any]:
    """The chat recipe's settings; a name that is not a string is left to the `recipe` type to refuse.

    The model-specific settings (parsers, attention backend, multimodal limits, speculative decoding, served
    name: contract/recipes.py MODEL_SPECIFIC) of one model never reach another: a recipe of another model than
    the defaults' starts from the neutral values, and a user's `model_repo` that is not the recipe's model
    gets them instead of the recipe's.
    """
    if not isinstance(name, str):
        return {}
    known = catalogue()
    fix = f"choose one of: {', '.join(n for n, r in sorted(known.items()) if r.kind == 'chat')}"
    if name not in known:
        raise SettingsError([f"{host_name}: setting `recipe` = {name!r} is invalid: no such recipe in the "
                             f"catalogue (recipes/); {fix}"])
    if known[name].kind != "chat":
        raise SettingsError([f"{host_name}: setting `recipe` = {name!r} is invalid: its kind is {known[name].kind!r}, "
                             f"and a host's recipe is a chat recipe (services take the others); {fix}"])
    chosen = known[name].settings
    recipe_repo = chosen.get("model_repo", defaults().get("model_repo"))
    # the defaults are another model's: the recipe's own over neutral
    if isinstance(recipe_repo, str) and recipe_repo != defaults().get("model_repo"):
        chosen = {**neutral_settings(recipe_repo), **chosen}
    if isinstance(model_repo, str) and model_repo != recipe_repo:
        return {**chosen, **neutral_settings(model_repo)}
    return chosen


def _check_ssh_hostname(host_name: str, data: dict[str, Any]) -> None:
    """pyinfra's `ssh_hostname` is also where the controller's URLs point and the host's LAN address
    (lan_address's default: peer URLs, the front door's server lines, status and bench URLs; contract/reach.py),
    so it has the `Host` grammar too."""
    value = data.get("ssh_hostname")
    if value is None:
        return
    try:
        _host(_one_line(value) if isinstance(value, str) else "")
    except ValueError as exc:
        raise SettingsError([f"{host_name}: `ssh_hostname` = {_shown(value)} is invalid: {exc}; it is also the "
                             f"host's LAN address (URLs, the front door's config): fix it in the inventory"]) from None


def parse_settings(host_name: str, data: dict[str, Any]) -> Settings:
    """Build one host's Settings, or raise SettingsError.

    Precedence, lowest first: group_data/all.py's defaults < the chosen recipe's settings (made neutral where
    the user's model_repo is another model: `recipe_settings`) < what the user set (see `user_set`) in the
    inventory, a group's data or `--data`.
    """
    _check_ssh_hostname(host_name, data)
    own = user_set(data)
    chosen = recipe_settings(host_name, own.get("recipe", defaults().get("recipe")), own.get("model_repo"))
    merged = {**defaults(), **chosen, **own}
    oversized = [f"{host_name}: setting `{_shown(k, str)}` {why}: fix it in the inventory or group_data"
                 for k, v in merged.items() if (why := _oversized(v))]
    if oversized:
        raise SettingsError(oversized)
    try:
        return Settings(**merged)
    except ValidationError as exc:
        raise SettingsError([_problem(host_name, err) for err in exc.errors()]) from None
