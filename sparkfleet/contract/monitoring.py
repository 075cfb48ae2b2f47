"""What the monitoring hosts, the Sparks, the front doors and the controller agree on: where each exporter answers,
the paths Prometheus scrapes over the LAN (always behind the backend key), the files the textfile collector reads
and the names of the metrics sparkfleet itself writes. One place, so the scrape config, the alert rules, the status
page, the guard, the front door and `status` cannot drift apart.
"""

from sparkfleet.contract import paths

GROUP = "monitoring"  # the inventory group whose hosts run Prometheus
# Debian's packages (paths.MONITORING_PACKAGES: the host read reports them), each with its own unit kept off
PROMETHEUS_PACKAGE, NODE_EXPORTER_PACKAGE, ALERTMANAGER_PACKAGE = paths.MONITORING_PACKAGES
FRONT_DOOR_GROUP = "front_door"  # the inventory group whose hosts run a front door
SERVICE_GROUPS = frozenset({FRONT_DOOR_GROUP, GROUP})  # a host in only these (and "all") is a service host, not a Spark
SERVICE_ROLE = "service"  # the plan's role of such a host: no model, no engine, no GPU stage


def is_service_host(groups) -> bool:
    """Whether a host in these inventory groups is a service host: in at least one of SERVICE_GROUPS and in no
    other group ("all" aside). A host in no group at all is a Spark, as every inventory before service hosts had."""
    named = set(groups) - {"all"}
    return bool(named) and named <= SERVICE_GROUPS


def backend_hop(groups_per_host) -> bool:
    """Whether the inventory has a backend hop: a host in `front_door` or `monitoring`, which asks the guards over
    the LAN with the backend key. Without one the guard is the office's API itself (clients bring the key)."""
    return any(set(groups) & SERVICE_GROUPS for groups in groups_per_host)


# Prometheus on a monitoring host: its own unit (Debian's prometheus.service stays off), loopback only.
PROMETHEUS_UNIT_NAME = "sparkfleet-prometheus.service"
PROMETHEUS_UNIT_PATH = paths.unit_path(PROMETHEUS_UNIT_NAME)
PROMETHEUS_DIR = f"{paths.CONFIG_DIR}/prometheus"
PROMETHEUS_CONFIG = f"{PROMETHEUS_DIR}/prometheus.yml"
PROMETHEUS_RULES = f"{PROMETHEUS_DIR}/alerts.yml"
PROMETHEUS_CONSOLES = f"{PROMETHEUS_DIR}/consoles"  # the office status page (a console template)
PROMETHEUS_CONSOLE_LIBRARIES = f"{PROMETHEUS_DIR}/console_libraries"  # empty: the page needs no library
PROMETHEUS_KEY = f"{PROMETHEUS_DIR}/backend.key"  # 0600, owned by prometheus: the key its scrapes send
# 0600, owned by prometheus: the host's own TLS key (paths.TLS_HOST_KEY's content), which its scrapes present
PROMETHEUS_TLS_KEY = f"{PROMETHEUS_DIR}/host.key"
PROMETHEUS_DATA = f"{paths.STATE_DIR}/prometheus"
PROMETHEUS_USER = "prometheus"  # Debian's package makes it
STATUS_PAGE = "/consoles/sparkfleet.html"  # where Prometheus serves the page (the front door maps /status to it)
STATUS_PAGE_FILE = "sparkfleet.html"  # its file in PROMETHEUS_CONSOLES, from templates/consoles/
FRONT_DOOR_STATUS_PATH = "/status"  # the page on the front door, for viewers (HTTP Basic), when it is a monitoring host
FRONT_DOOR_VIEWERS_MAP = f"{paths.FRONT_DOOR_DIR}/viewers.map"  # 0600: "<viewer> <SHA-256 of the password, hex>"

# Scrape jobs: every target carries HOST_LABEL = its inventory host name (a front door's too), so the page, the
# alerts and the dashboard join an engine, its node and its front door state by host.
HOST_LABEL = "host"
JOB_ENGINE = "engine"  # each engine's ENGINE_METRICS_PATH (vLLM's `vllm:` metrics, label model_name)
JOB_NODE = "node"  # each Spark's node exporter, with the textfile collector's GPU_METRICS and WATCHDOG_METRICS
JOB_FRONT_DOOR = "front_door"  # HAProxy's promex on each front door
JOB_FRONT_DOOR_TLS = f"{JOB_FRONT_DOOR}_tls"  # the same, of the front doors that speak https
JOB_USAGE = "usage"  # the front door's USAGE_METRICS

# "Drained" as the page and the alerts read it: the front door's own exporter (promex) gives each backend server
# (label server = the inventory host name) of proxy FRONT_DOOR_PROXY one series per state, 1 for the current one.
# MAINT: out of rotation (`sparkfleet drain`, a rollout's batch); DRAIN: set aside, finishing its requests.
SERVER_STATUS_METRIC = "haproxy_server_status"
FRONT_DOOR_PROXY = "engines"  # the front door's default backend (fleet/front_door/runtime.py BACKEND)
DRAINED_STATES = ("MAINT", "DRAIN")

# On every Spark: Debian's node exporter, its own unit on loopback (Debian's listens on every address), its
# textfile collector reading TEXTFILE_DIR, which a timer fills with the GB10's and the watchdog's state.
NODE_EXPORTER_UNIT_NAME = "sparkfleet-node-exporter.service"
NODE_EXPORTER_UNIT_PATH = paths.unit_path(NODE_EXPORTER_UNIT_NAME)
NODE_EXPORTER_PORT = 9100  # on 127.0.0.1; the guard answers NODE_METRICS_PATH on the API port
TEXTFILE_DIR = f"{paths.STATE_DIR}/textfile"
TEXTFILE_UNIT = "sparkfleet-textfile.service"
TEXTFILE_TIMER = "sparkfleet-textfile.timer"
TEXTFILE = f"{paths.BIN_DIR}/sparkfleet-textfile"

# What Prometheus asks over the LAN, every path with the backend key (a caller without it gets 401).
ENGINE_METRICS_PATH = "/metrics"  # on each engine's API port, through the guard
NODE_METRICS_PATH = "/node/metrics"  # on the host's API port, through the guard: the node exporter
FRONT_DOOR_METRICS_PATH = "/haproxy/metrics"  # on the front door's port: HAProxy's own exporter (promex)
USAGE_METRICS_PATH = "/usage/metrics"  # on the front door's port: per-user usage
USAGE_TABLE = "sparkfleet_usage"  # the front door's stick table, by user name (files/sparkfleet-usage.lua reads it)
USAGE_NO_MODEL, USAGE_OTHER_MODEL = "_none", "_other"  # model labels: none in the request, not a served name

# The metrics sparkfleet writes (textfile collector and front door), by what they mean.
GPU_METRICS = {
    "sparkfleet_gpu_reading_ok": "1 when nvidia-smi answered and its fields were read, else 0",
    "sparkfleet_gpu_sm_clock_mhz": "the SM clock now",
    "sparkfleet_gpu_sm_clock_max_mhz": "the SM clock's maximum",
    "sparkfleet_gpu_power_draw_watts": "the power drawn now",
    "sparkfleet_gpu_temperature_celsius": "the GPU's temperature",
    "sparkfleet_gpu_throttle_active": "1 per throttle reason (label reason) the driver reports active",
}
WATCHDOG_METRICS = {
    "sparkfleet_watchdog_gave_up": "1 per unit (label unit) the watchdog stopped restarting",
    "sparkfleet_watchdog_restarts_total": "restarts the watchdog made of a unit (label unit)",
    "sparkfleet_watchdog_probe_ok": "1 when the watchdog's last probe of a unit (label unit) passed",
}
TLS_EXPIRY_METRIC = "sparkfleet_tls_cert_expiry_seconds"
TLS_METRICS = {TLS_EXPIRY_METRIC: "when the host's fleet TLS certificate ends (seconds since the epoch)"}
QUALITY_SCORE_METRIC = "sparkfleet_quality_score"
QUALITY_BELOW_METRIC = "sparkfleet_quality_below_baseline"
QUALITY_METRICS = {QUALITY_SCORE_METRIC: "a model's (label model) share of probes passed at its last evaluation",
                   QUALITY_BELOW_METRIC: "1 when that evaluation fell below its release's baseline, else 0"}
USAGE_METRICS = {
    "sparkfleet_user_requests_total": "requests per user (label user) and model (label model)",
    "sparkfleet_user_errors_total": "responses of status 400 and up, per user and model",
    "sparkfleet_user_bytes_in_total": "request bytes per user",
    "sparkfleet_user_bytes_out_total": "response bytes per user",
    "sparkfleet_user_in_flight": "requests in flight per user",
    "sparkfleet_user_prompt_tokens_total": "prompt tokens the engines reported (usage) per user and model",
    "sparkfleet_user_completion_tokens_total": "completion tokens the engines reported per user and model",
    "sparkfleet_user_limited_total": "requests refused with 429 per user",
}

# Throttle reasons, as nvidia-smi names its clocks_event_reasons.* fields (label `reason` of
# sparkfleet_gpu_throttle_active). The benign ones slow nothing a user waits on: an idle GPU clocks down, and
# the other two are clocks set on purpose (the page shows them apart). Every other reason active for a while is a
# GB10 throttling.
THROTTLE_REASONS = ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "hw_thermal_slowdown",
                    "hw_power_brake_slowdown", "sw_thermal_slowdown", "sync_boost")
BENIGN_THROTTLE_REASONS = ("gpu_idle", "applications_clocks_setting", "sync_boost")
GPU_TEXTFILE = f"{TEXTFILE_DIR}/gpu.prom"
WATCHDOG_TEXTFILE = f"{TEXTFILE_DIR}/watchdog.prom"
QUALITY_TEXTFILE = f"{TEXTFILE_DIR}/quality.prom"  # written from the controller (fleet/quality.py, `sparkfleet eval`)
PROMETHEUS_READY_PATH = "/-/ready"
ALERTS_API_PATH = "/api/v1/alerts"

# Alertmanager on a monitoring host, only with alertmanager_webhook_url: its own unit on loopback, no cluster port.
ALERTMANAGER_UNIT_NAME = "sparkfleet-alertmanager.service"
ALERTMANAGER_UNIT_PATH = paths.unit_path(ALERTMANAGER_UNIT_NAME)
ALERTMANAGER_DIR = f"{PROMETHEUS_DIR}/alertmanager"
ALERTMANAGER_CONFIG = f"{ALERTMANAGER_DIR}/alertmanager.yml"  # 0600, owned by prometheus: it holds the webhook URL
ALERTMANAGER_DATA = f"{paths.STATE_DIR}/alertmanager"
