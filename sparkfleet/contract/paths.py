"""Where sparkfleet puts things on a host: one place, so tests and tasks agree."""

import re

from sparkfleet.contract.shared import PACKAGE_NAME, verify

SYSTEMD_DIR = "/etc/systemd/system"  # where every unit sparkfleet installs lives (unit_path)


def unit_path(unit: str) -> str:
    """The file of a unit sparkfleet installs."""
    return f"{SYSTEMD_DIR}/{unit}"


UNIT_NAME = "sparkfleet-vllm.service"
# Engines listen on loopback only, ENGINE_PORT_OFFSET above the port the host's guard answers on (the API port).
ENGINE_HOST = "127.0.0.1"
ENGINE_PORT_OFFSET = 10000
MAX_API_PORT = 65535 - ENGINE_PORT_OFFSET


def engine_port(api_port: int) -> int:
    """Where the engine behind `api_port` listens on 127.0.0.1 (the guard forwards to it)."""
    return api_port + ENGINE_PORT_OFFSET



UNIT_PATH = unit_path(UNIT_NAME)
RAY_UNIT_NAME = "sparkfleet-ray.service"  # a tensor-parallel member's Ray node (head or worker)
RAY_UNIT_PATH = unit_path(RAY_UNIT_NAME)
RAY_CONTAINER = "sparkfleet-ray"
# a RAG service's unit (service_unit): the names follow the settings grammar, and a name read back from a host that
# does not match it is ignored, never acted on
SERVICE_UNIT = re.compile(r"sparkfleet-vllm-([a-z][a-z0-9-]{0,30})\.service")


def service_unit(name: str) -> str:
    """The unit of the RAG service `name` (SERVICE_UNIT matches it)."""
    return f"sparkfleet-vllm-{name}.service"


# An on-demand service (docs/several-models.md): systemd listens for it on ON_DEMAND_HOST at its engine's port (the
# guard forwards there), starts its proxy on the first connection, and the proxy requires (so starts) its engine unit.
# The names are not SERVICE_UNIT's: a proxy is never taken for a service.
ON_DEMAND_HOST = "127.0.0.2"
ON_DEMAND_UNIT = re.compile(r"sparkfleet-ondemand-([a-z][a-z0-9-]{0,30})\.(socket|service)")


def on_demand_socket(name: str) -> str:
    return f"sparkfleet-ondemand-{name}.socket"


def on_demand_proxy(name: str) -> str:
    return f"sparkfleet-ondemand-{name}.service"


def service_watchdog_state(name: str) -> str:
    """The watchdog's state of the service `name` (WATCHDOG_STATE is the chat model's)."""
    return f"{STATE_DIR}/watchdog-{name}.json"


def service_container(name: str) -> str:
    """The container of the RAG service `name` (its unit runs it)."""
    return f"vllm-{name}"


def release_unit(unit: str) -> bool:
    """Whether `unit` is one a release runs (the chat engine's, a member's Ray node's, a service's): what a release
    record's `units` may name and what a rollback sets aside when the release it restores does not run it."""
    return unit in (UNIT_NAME, RAY_UNIT_NAME) or bool(SERVICE_UNIT.fullmatch(unit))


STATE_DIR = "/var/lib/sparkfleet"  # what sparkfleet keeps on a host that is not configuration
RAY_DIR = f"{STATE_DIR}/ray"  # Ray's /tmp/ray in both containers: the head's vLLM reaches the raylet's sockets
SHARE_UNIT_NAME = "sparkfleet-share.service"
SHARE_UNIT_PATH = unit_path(SHARE_UNIT_NAME)
CONFIG_DIR = "/etc/sparkfleet"
ENGINE_ENV = f"{CONFIG_DIR}/engine.env"  # 0600: the API key and engine_env (format: contract/formats.py)
HUB_ENV = f"{CONFIG_DIR}/hub.env"  # 0600: the hub token
FLEET_TOKEN = f"{CONFIG_DIR}/fleet.token"  # 0600, owned by SHARE_USER: what the peer shares ask for
# 0600, root: a group member's Ray token, mounted read-only (same path) into its Ray container and the head's engine
RAY_TOKEN = f"{CONFIG_DIR}/ray.token"
SHARE_USER = "sparkfleet-share"  # the share's own system user: no login, no home, reads the model root
RELEASE_FILE = f"{CONFIG_DIR}/release.json"
SERVING_FILE = f"{CONFIG_DIR}/serving.json"  # what counts as serving (contract/serving.py) and the watchdog's settings
PREVIOUS_DIR = f"{CONFIG_DIR}/previous"  # the replaced unit, env and release record: rollback needs no download
PREVIOUS_RELEASE_FILE = f"{PREVIOUS_DIR}/release.json"
PREVIOUS_ENGINE_ENV = f"{PREVIOUS_DIR}/engine.env"  # 0600: the kept release's fabric lines and engine_env names
MEMORY_PLAN = f"{CONFIG_DIR}/memory.json"  # every engine unit's share, the budget (contract/formats.py memory_plan)
LIB_DIR = "/opt/sparkfleet"
BIN_DIR = f"{LIB_DIR}/bin"
RUNTIME_DIR = f"{LIB_DIR}/runtime"  # the hub and openai clients, shipped from the controller
# The one rule for which runtime bundle the helpers run with: the newest unpacked (by mtime; the
# names are content hashes, so their order means nothing). Prints its path, no trailing slash.
NEWEST_RUNTIME_COMMAND = f"ls -dt {RUNTIME_DIR}/runtime-*/ 2>/dev/null | head -1 | sed 's:/*$::'"
# the helpers' stdlib package (files/sparkfleet_host/, one managed file a module): `python3 HOST_MODULE ...` runs its
# commands (a rollback's env edit, the on-demand models' last requests)
HOST_MODULE = f"{BIN_DIR}/{PACKAGE_NAME}"
HOST_MODULE_BEFORE = f"{BIN_DIR}/{PACKAGE_NAME}.py"  # the one-file module the package replaced: a converge removes it
MEMCHECK = f"{BIN_DIR}/sparkfleet-memcheck"  # a vLLM unit's pre-start memory check
ON_DEMAND_HELPER = f"{BIN_DIR}/sparkfleet-on-demand"  # an on-demand proxy's wait for its engine's answer
SOCKET_PROXYD = "/usr/lib/systemd/systemd-socket-proxyd"  # systemd's own (Debian and Ubuntu ship it there)
WATCHDOG = f"{BIN_DIR}/sparkfleet-watchdog"
WATCHDOG_STATE = f"{STATE_DIR}/watchdog.json"
WATCHDOG_UNIT = "sparkfleet-watchdog.service"
WATCHDOG_TIMER = "sparkfleet-watchdog.timer"
MANIFEST_DIR = f"{STATE_DIR}/manifests"
# 0644, figures only: each release's measured decode rate and TTFT (contract/speed.py), written by a rollout's
# speed gate from the controller, read as the next rollout's baseline; state, outside what a converge manages
SPEED_FILE = f"{STATE_DIR}/speed.json"
# 0644, answers cut to 200 characters and verdicts only: each release's first answer-quality evaluation (its
# baseline) and its latest one, per served model (contract/quality.py), written from the controller by `sparkfleet
# eval` (fleet/quality.py); state, outside what a converge manages
QUALITY_FILE = f"{STATE_DIR}/quality.json"
# 0644, paths and counts only: how far a model fetch is (sparkfleet-fetch rewrites it each second, the controller's
# progress watcher reads it while a deploy runs); under /run, so a reboot forgets it
FETCH_PROGRESS = "/run/sparkfleet/fetch-progress.json"
VERIFIED_RECORD = verify.RECORD_NAME  # inside each model directory
STAGING_DIR_NAME = verify.STAGING_NAME  # under model_root: same file system, atomic rename
TOOLKIT_KEYRING = "/etc/apt/keyrings/nvidia-container-toolkit.gpg"
TOOLKIT_SOURCE = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"
PLATFORM_PINS = "/etc/apt/preferences.d/sparkfleet-platform"  # platform_pins: apt moves none of those packages
DAEMON_JSON = "/etc/docker/daemon.json"
CDI_SPEC = "/etc/cdi/nvidia.yaml"
CDI_UNIT = "sparkfleet-cdi.service"
CDI_STAMP = f"{STATE_DIR}/cdi-driver"  # the driver version the spec was generated for
TOOLKIT_PACKAGES = (
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
)
RAY_CHECK = f"{BIN_DIR}/sparkfleet-ray-check"  # on a member: which Ray nodes are alive, with how many GPUs

# The front door (hosts of the inventory group front_door) and each host's guard: HAProxy instances of their own.
FRONT_DOOR_UNIT_NAME = "sparkfleet-front-door.service"
FRONT_DOOR_UNIT_PATH = unit_path(FRONT_DOOR_UNIT_NAME)
FRONT_DOOR_DIR = f"{CONFIG_DIR}/front-door"
FRONT_DOOR_CONFIG = f"{FRONT_DOOR_DIR}/haproxy.cfg"
FRONT_DOOR_USERS_MAP = f"{FRONT_DOOR_DIR}/users.map"  # 0600: "<key> <user>" lines
FRONT_DOOR_BACKEND_MAP = f"{FRONT_DOOR_DIR}/backend.map"  # 0600: the engines' Authorization header
FRONT_DOOR_LIMITS_MAP = f"{FRONT_DOOR_DIR}/limits.map"  # 0600: "<user> <requests a minute>:<at once>" (0: none)
FRONT_DOOR_USAGE_LUA = f"{FRONT_DOOR_DIR}/sparkfleet-usage.lua"  # files/sparkfleet-usage.lua: /usage/metrics
FRONT_DOOR_TLS_PEM = f"{FRONT_DOOR_DIR}/tls.pem"  # 0600: certificate and key, as HAProxy reads them
FRONT_DOOR_RUNTIME_NAME = "sparkfleet-front-door"  # systemd's RuntimeDirectory= and StateDirectory= name
FRONT_DOOR_SOCKET = f"/run/{FRONT_DOOR_RUNTIME_NAME}/admin.sock"
FRONT_DOOR_STATE_FILE = f"/var/lib/{FRONT_DOOR_RUNTIME_NAME}/servers.state"
# root-only: the backends `sparkfleet drain` set aside, one name a line, until `sparkfleet undrain`; runtime
# state beside HAProxy's own, outside what a converge manages (MANAGED_GLOBS), so a converge leaves it be
FRONT_DOOR_DRAINED = f"/var/lib/{FRONT_DOOR_RUNTIME_NAME}/drained"
# root-only: the backends a rollout (or an upgrade) set aside, one line each (who, when: roles/front_door/holds.py
# `Hold`), removed when it puts them back; a hold whose operation is gone is put back by the next converge or rollout
FRONT_DOOR_HOLDS = f"/var/lib/{FRONT_DOOR_RUNTIME_NAME}/held"
# Two or more doors, one address (roles/front_door/address.py): keepalived, Debian's, under a unit of our own
# (Debian's keepalived.service stays masked); its config beside the door's.
DOOR_ADDRESS_UNIT_NAME = "sparkfleet-door-address.service"
DOOR_ADDRESS_UNIT_PATH = unit_path(DOOR_ADDRESS_UNIT_NAME)
DOOR_ADDRESS_CONFIG = f"{FRONT_DOOR_DIR}/keepalived.conf"
DOOR_ADDRESS_RUNTIME_NAME = "sparkfleet-door-address"  # RuntimeDirectory= (keepalived's pid files)
KEEPALIVED_PACKAGE = "keepalived"
KEEPALIVED_UNIT = "keepalived.service"  # Debian's own: masked before the package is installed
# The per-user usage counters' snapshot (files/sparkfleet-usage.lua loads it at start; written by
# files/sparkfleet-usage-save at each reload, stop and every USAGE_SNAPSHOT_S): what a restarted door counts on
FRONT_DOOR_USAGE_SNAPSHOT = f"/var/lib/{FRONT_DOOR_RUNTIME_NAME}/usage.snapshot"
USAGE_SAVE = f"{BIN_DIR}/sparkfleet-usage-save"
# files/sparkfleet-servers-save: the door's server-state file, before each reload and after a drain or undrain
SERVERS_SAVE = f"{BIN_DIR}/sparkfleet-servers-save"
USAGE_SAVE_UNIT = "sparkfleet-usage-save.service"
USAGE_SAVE_TIMER = "sparkfleet-usage-save.timer"
USAGE_SNAPSHOT_S = 5
# The chat UI (Open WebUI, on the host of the inventory group chat_ui): its container on a socket, its data on the
# host (chats, settings: SQLite), the copies of its database kept at each version change, its 0600 settings file
CHAT_UI_GROUP = "chat_ui"
CHAT_UI_UNIT_NAME = "sparkfleet-chat-ui.service"
CHAT_UI_UNIT_PATH = unit_path(CHAT_UI_UNIT_NAME)
CHAT_UI_CONTAINER = "sparkfleet-chat-ui"
CHAT_UI_DIR = f"{STATE_DIR}/chat-ui"
CHAT_UI_DATA = f"{CHAT_UI_DIR}/data"  # the image's /app/backend/data
CHAT_UI_BACKUPS = f"{CHAT_UI_DIR}/backups"  # webui.db.<image digest>: the database as that version left it
CHAT_UI_DOOR_CA = f"{CONFIG_DIR}/chat-ui-door-ca.pem"  # what Open WebUI trusts for the door's https (public)
CHAT_UI_ENV = f"{CONFIG_DIR}/chat-ui.env"  # 0600: its secrets and settings, read by its shell, never `docker inspect`ed
# the door's secrets HAProxy reads before its config (`setenv`: the chat UI's signing secret), 0600
FRONT_DOOR_SECRETS = f"{CONFIG_DIR}/front-door/secrets.cfg"
FRONT_DOOR_CHAT_UI_USERS = f"{CONFIG_DIR}/front-door/chat-ui-users.map"  # "<email> <user>": who a signed token names
FRONT_DOOR_LOGIN_PAGE = f"{CONFIG_DIR}/front-door/login.html"

GUARD_UNIT_NAME = "sparkfleet-guard.service"
GUARD_UNIT_PATH = unit_path(GUARD_UNIT_NAME)
GUARD_DIR = f"{CONFIG_DIR}/guard"
GUARD_CONFIG = f"{GUARD_DIR}/haproxy.cfg"
GUARD_KEY_MAP = f"{GUARD_DIR}/key.map"  # 0600: "engines Bearer <api_key>", the header a caller must send
GUARD_READY_LUA = f"{GUARD_DIR}/sparkfleet-ready.lua"  # files/sparkfleet-ready.lua: a door's check of a chat engine
GUARD_RUNTIME_NAME = "sparkfleet-guard"
# the guard's read-only stats (a host with on-demand services only): each one's last request, for the start check
GUARD_STATS_SOCKET = f"/run/{GUARD_RUNTIME_NAME}/stats.sock"
# TLS on every backend hop (roles/pki.py): the fleet CA's certificate and the host's own, issued by the controller
# at converge; HAProxy loads `<crt>.key` beside a certificate by itself (ssl-load-extra-files, "all" by default)
TLS_DIR = f"{CONFIG_DIR}/tls"
TLS_CA = f"{TLS_DIR}/ca.crt"  # 0644: the fleet CA, which every guard and every caller of one verifies against
TLS_HOST_CERT = f"{TLS_DIR}/host.crt"  # 0644: this host's certificate (client use too on a door, a monitoring host)
TLS_HOST_KEY = f"{TLS_HOST_CERT}.key"  # 0600: its key, derived from the CA's, the host's name and its key generation
# a door's peers link (HAProxy's shared usage table): pinned to the doors, not chained to the fleet CA
TLS_PEERS_CA = f"{TLS_DIR}/peers.crt"  # 0644: every door's self-signed peers certificate, the only ones it trusts
TLS_PEERS_PEM = f"{TLS_DIR}/peers.pem"  # 0600: this door's peers certificate and its key
# 0644: when the host's certificate ends, for the node exporter's textfile collector (contract/monitoring.py
# TEXTFILE_DIR), written by the node_metrics stage from the certificate the converge left in force
TLS_EXPIRY_TEXTFILE = f"{STATE_DIR}/textfile/sparkfleet-tls.prom"
HAPROXY_CHROOT = "/var/lib/haproxy"  # Debian's haproxy package makes it empty; both HAProxy units chroot there
# Open WebUI's only listener (roles/chat_ui.py): a unix socket, never a port (its host's network is the engines'), in a
# directory of the chroot (root:haproxy 0710) that the guard's HAProxy reaches after its chroot and only the chat UI's
# container mounts: no other user or container of the host gets in
CHAT_UI_SOCKET_DIR = f"{HAPROXY_CHROOT}/sparkfleet-chat-ui"
CHAT_UI_SOCKET = f"{CHAT_UI_SOCKET_DIR}/open-webui.sock"

# What one batched read of a host's state covers (sparkfleet/host/state.py): every file and directory sparkfleet
# manages outside the model root. A `*` is the last component's wildcard (depth 1: never a model's bytes).
MANAGED_GLOBS = (
    CONFIG_DIR, f"{CONFIG_DIR}/*", f"{CONFIG_DIR}/guard/*", f"{CONFIG_DIR}/front-door/*", f"{CONFIG_DIR}/tls/*",
    BIN_DIR, f"{BIN_DIR}/*", f"{HOST_MODULE}/*", f"{RUNTIME_DIR}/*", f"{SYSTEMD_DIR}/sparkfleet-*", TOOLKIT_KEYRING,
    TOOLKIT_SOURCE, DAEMON_JSON, PLATFORM_PINS, TLS_EXPIRY_TEXTFILE,
    # the backups' (contract/backup.py CONFIG, TARGET_SSHD_CONFIG): a host that keeps none still asks they are absent
    f"{CONFIG_DIR}/backup/*", "/etc/ssh/sshd_config.d/sparkfleet-*", f"{STATE_DIR}/textfile/backup.prom",
)
# The units that read covers besides each sparkfleet-* unit in SYSTEMD_DIR.
MANAGED_UNITS = ("docker.service", "haproxy.service")
# Debian's monitoring packages (stages monitoring and node_metrics), each with its own unit, which stays off.
MONITORING_PACKAGES = {"prometheus": "prometheus.service",
                       "prometheus-node-exporter": "prometheus-node-exporter.service",
                       "prometheus-alertmanager": "prometheus-alertmanager.service"}
# The Debian packages that read reports (name, version, installed): the ones sparkfleet installs.
MANAGED_PACKAGES = ("haproxy", "socat", KEEPALIVED_PACKAGE, *TOOLKIT_PACKAGES, *MONITORING_PACKAGES,
                    "restic")  # restic: the backups' (roles/backup.py PACKAGE)
# The system users it reports (passwd entry): the ones sparkfleet makes.
MANAGED_USERS = (SHARE_USER, "sparkfleet-backup")  # the backup target's SFTP user (contract/backup.py TARGET_USER)

# Debian's (update-notifier's) flag that a host needs a reboot for what was installed: a new kernel, a driver
REBOOT_REQUIRED = "/var/run/reboot-required"
