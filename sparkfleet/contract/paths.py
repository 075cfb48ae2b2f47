"""Where sparkfleet puts things on a host: one place, so tests and tasks agree."""

from sparkfleet.contract.shared import host_module

UNIT_NAME = "sparkfleet-vllm.service"
# Engines listen on loopback only, ENGINE_PORT_OFFSET above the port the host's guard answers on (the API port).
ENGINE_HOST = "127.0.0.1"
ENGINE_PORT_OFFSET = 10000
MAX_API_PORT = 65535 - ENGINE_PORT_OFFSET


def engine_port(api_port: int) -> int:
    """Where the engine behind `api_port` listens on 127.0.0.1 (the guard forwards to it)."""
    return api_port + ENGINE_PORT_OFFSET



UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
RAY_UNIT_NAME = "sparkfleet-ray.service"  # a tensor-parallel member's Ray node (head or worker)
RAY_UNIT_PATH = f"/etc/systemd/system/{RAY_UNIT_NAME}"
RAY_CONTAINER = "sparkfleet-ray"
RAY_DIR = "/var/lib/sparkfleet/ray"  # Ray's /tmp/ray in both containers: the head's vLLM reaches the raylet's sockets
SHARE_UNIT_NAME = "sparkfleet-share.service"
SHARE_UNIT_PATH = f"/etc/systemd/system/{SHARE_UNIT_NAME}"
CONFIG_DIR = "/etc/sparkfleet"
ENGINE_ENV = f"{CONFIG_DIR}/engine.env"  # 0600: VLLM_API_KEY and engine_env
API_KEY_VAR = "VLLM_API_KEY"  # the API key's line of ENGINE_ENV: a rollback writes today's, never a kept one
HUB_ENV = f"{CONFIG_DIR}/hub.env"  # 0600: the hub token
FLEET_TOKEN = f"{CONFIG_DIR}/fleet.token"  # 0600, owned by SHARE_USER: what the peer shares ask for
# 0600, root: a group member's Ray token, mounted read-only (same path) into its Ray container and the head's engine
RAY_TOKEN = f"{CONFIG_DIR}/ray.token"
SHARE_USER = "sparkfleet-share"  # the share's own system user: no login, no home, reads the model root
RELEASE_FILE = f"{CONFIG_DIR}/release.json"
PREVIOUS_DIR = f"{CONFIG_DIR}/previous"  # the replaced unit, env and release record: rollback needs no download
PREVIOUS_RELEASE_FILE = f"{PREVIOUS_DIR}/release.json"
LIB_DIR = "/opt/sparkfleet"
BIN_DIR = f"{LIB_DIR}/bin"
RUNTIME_DIR = f"{LIB_DIR}/runtime"  # the hub and openai clients, shipped from the controller
# The one rule for which runtime bundle the helpers run with: the newest unpacked (by mtime; the
# names are content hashes, so their order means nothing). Prints its path, no trailing slash.
NEWEST_RUNTIME_COMMAND = f"ls -dt {RUNTIME_DIR}/runtime-*/ 2>/dev/null | head -1 | sed 's:/*$::'"
MANIFEST_DIR = "/var/lib/sparkfleet/manifests"
VERIFIED_RECORD = host_module.RECORD_NAME  # inside each model directory
STAGING_DIR_NAME = host_module.STAGING_NAME  # under model_root: same file system, atomic rename
TOOLKIT_KEYRING = "/etc/apt/keyrings/nvidia-container-toolkit.gpg"
TOOLKIT_SOURCE = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"
DAEMON_JSON = "/etc/docker/daemon.json"
TOOLKIT_PACKAGES = (
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
)
RAY_CHECK = f"{BIN_DIR}/sparkfleet-ray-check"  # on a member: which Ray nodes are alive, with how many GPUs
# What one batched read of a host's state covers (sparkfleet/host/state.py): every file and directory sparkfleet
# manages outside the model root. A `*` is the last component's wildcard (depth 1: never a model's bytes).
MANAGED_GLOBS = (
    CONFIG_DIR, f"{CONFIG_DIR}/*", f"{CONFIG_DIR}/guard/*", f"{CONFIG_DIR}/front-door/*",
    BIN_DIR, f"{BIN_DIR}/*", f"{RUNTIME_DIR}/*", "/etc/systemd/system/sparkfleet-*", TOOLKIT_KEYRING, TOOLKIT_SOURCE, DAEMON_JSON,
)
# The units that read covers besides each /etc/systemd/system/sparkfleet-* unit.
MANAGED_UNITS = ("docker.service", "haproxy.service")
# The Debian packages that read reports (name, version, installed): the ones sparkfleet installs.
MANAGED_PACKAGES = ("haproxy", "socat", *TOOLKIT_PACKAGES)
