"""Where sparkfleet puts things on a host: one place, so tests and tasks agree."""

UNIT_NAME = "sparkfleet-vllm.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
SHARE_UNIT_NAME = "sparkfleet-share.service"
SHARE_UNIT_PATH = f"/etc/systemd/system/{SHARE_UNIT_NAME}"
CONFIG_DIR = "/etc/sparkfleet"
ENGINE_ENV = f"{CONFIG_DIR}/engine.env"  # 0600: VLLM_API_KEY and engine_env
HUB_ENV = f"{CONFIG_DIR}/hub.env"  # 0600: the hub token
RELEASE_FILE = f"{CONFIG_DIR}/release.json"
PREVIOUS_DIR = f"{CONFIG_DIR}/previous"  # the replaced unit, env and release record: rollback needs no download
PREVIOUS_RELEASE_FILE = f"{PREVIOUS_DIR}/release.json"
LIB_DIR = "/opt/sparkfleet"
BIN_DIR = f"{LIB_DIR}/bin"
RUNTIME_DIR = f"{LIB_DIR}/runtime"  # the hub and openai clients, shipped from the controller
MANIFEST_DIR = "/var/lib/sparkfleet/manifests"
VERIFIED_RECORD = ".sparkfleet-verified.json"  # inside each model directory
STAGING_DIR_NAME = ".staging"  # under model_root: same file system, atomic rename
TOOLKIT_KEYRING = "/etc/apt/keyrings/nvidia-container-toolkit.gpg"
TOOLKIT_SOURCE = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"
DAEMON_JSON = "/etc/docker/daemon.json"
TOOLKIT_PACKAGES = (
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
)
