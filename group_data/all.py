"""Defaults for every Spark: the known-good Qwen3.5-35B-A3B-FP8 release.

Override any of these per group (`group_data/<group>.py`), per host (inventory
data) or per run (`pyinfra ... --data key=value`). Every key is validated by
`sparkfleet.contract.settings.Settings` before any host is touched; an unknown
key is refused with a did-you-mean. This file is the only place a default is
written: the settings module merges it under each host's data too, so a
project that uses the installed package gets the same defaults.
"""

# --- Platform: what preflight expects to find ------------------------------
expected_arch = "aarch64"  # `uname -m` of a DGX Spark (GB10 is Arm)
expected_gpu_name = "NVIDIA GB10"  # nvidia-smi --query-gpu=name
min_driver_version = "580.95.05"  # first public GB10 driver
min_cuda_version = "13.0"  # CUDA version nvidia-smi reports
# MemTotal's floor in GiB; None: 90 % of host_memory_gb (107.3 GiB for a 128 GB Spark), so that preflight refuses a
# host with less memory than the plan fitted its models in (a 64 GB Spark left at 128)
min_memory_gib = None
service_min_memory_gib = 1  # MemTotal of a service host (only in groups front_door/monitoring: no GPU, no model)
service_min_disk_gib = 2  # free disk at / of a service host (Prometheus's history, the packages)
# versions known to break a Spark, refused by preflight: {glob of `uname -r` or of the driver version: why}; the why
# is printed with the refusal; an office adds its own, or takes out one it has checked
refused_kernels = {"6.17.0-1008*": "kernel panics reported on NVIDIA's DGX Spark forum"}  # on every host
# on the members of a tensor-parallel group (NCCL between the Sparks)
refused_pair_kernels = {"7.0.0-1019*": "NCCL over RoCE between two Sparks broken (eugr/spark-vllm-docker #392)"}
refused_drivers = {}  # none reported known-bad on GB10 yet; e.g. {"580.95.*": "why"}
# the packages the release stands on, held at a version (a glob) by an apt pin, so that neither unattended-upgrades
# nor a manual `apt upgrade` moves them: e.g. {"linux-image-nvidia-hwe-24.04": "6.17.0-1032*"}; {}: none pinned
platform_pins = {}

# --- NVIDIA Container Toolkit (apt); offices may point these at a mirror ----
# the toolkit's apt repository ({arch}: arm64 or amd64)
toolkit_repo_url = "https://nvidia.github.io/libnvidia-container/stable/deb/{arch}"
# where the repository's signing key is fetched
toolkit_key_url = "https://nvidia.github.io/libnvidia-container/gpgkey"
toolkit_key_fingerprint = "C95B321B61E88C1809C4F759DDCAE044F796ECB0"  # the signing key must have it
toolkit_version = "1.18.1-1"  # all four packages pinned to it; None: keep the installed (DGX OS ships one)
min_toolkit_version = "1.17.8-1"  # with toolkit_version None: an older or missing toolkit is replaced by the
#                                  repository's newest, which must meet it (1.17.8 fixes CVE-2025-23266)

# --- Recipe: a reviewed release from the catalogue (recipes/*.toml) -----------
# Precedence, lowest first: these defaults < the recipe's [settings] < what the inventory, a group's data
# or `--data` sets. The default recipe's settings equal the defaults below; "qwen3.5-35b-a3b-fp8-mtp" is
# its speed profile (MTP speculative decoding).
recipe = "qwen3.5-35b-a3b-fp8"  # the release whose [settings] sit between these defaults and yours

# --- Model -----------------------------------------------------------------
model_hub = "modelscope"  # where the model comes from: "modelscope" or "huggingface"
model_repo = "Qwen/Qwen3.5-35B-A3B-FP8"  # the model repository on model_hub
model_revision = "master"  # branch, tag or commit; resolved to a commit at plan time
hub_endpoint = None  # a mirror's URL; None = the client's own default
controller_hub_endpoint = None  # where the controller reaches the hub, if not hub_endpoint
hub_token = None  # secret: kept in a root-only file on the host
model_root = "/var/lib/sparkfleet/models"  # where model directories live (staging is beside them)
full_verify = False  # True (`--data full_verify=True`) re-hashes every file instead of trusting the record
model_source = "peer"  # "hub": each host from the hub; "peer": one host from the hub, the others
#                        from it over the LAN; "controller": pushed from the controller's verified copy
peer_port = 8090  # where each host shares its verified model files with the others (read-only)
lan_address = None  # how the other Sparks reach this host; None = its ssh_hostname, else its inventory name
keep_releases = 2  # model directories kept per host (never fewer than current + previous)
controller_model_dir = None  # the controller's verified copy (controller mode); None = .cache/models/
engine_image_archive = None  # a `docker save` of engine_image on the controller, loaded where it is missing
controller_registry_url = None  # where the controller asks engine_image's registry for its digest, if not there

# --- Engine: vLLM, SGLang or llama.cpp in Docker -----------------------------
engine = "vllm"  # "vllm", "sglang" or "llamacpp": which server runs the model (a recipe names its engine)
engine_image = "vllm/vllm-openai:v0.33.0"  # pinned by digest at plan time (a tag is resolved, @sha256: kept)
vllm_version = "0.33.0"  # with engine "vllm": the flag table the engine arguments are checked against
sglang_version = "0.5.23"  # with engine "sglang": its flag table (sparkfleet/release/engines/)
llamacpp_version = "11669"  # with engine "llamacpp": llama-server's build number, its flag table
model_files = None  # globs of the repository's files to fetch and serve (a GGUF repo holds many quants); None: all
expected_concurrency = None  # users at once the fleet should serve well: `plan` advises a pair's topology from it
served_model_name = "Qwen3.5-35B-A3B"  # the model name clients ask for
api_host = "127.0.0.1"  # where the host's API (its guard) answers; a LAN address needs api_key (or
#                        allow_unauthenticated_api). The engine itself listens on 127.0.0.1 only
api_port = 8000  # the guard's port; the engine listens on 127.0.0.1:api_port + 10000 (so <= 55535)
api_key = None  # secret: the guard's key, and the engine's through a root-only env file (under the variable it
#                reads: VLLM_API_KEY, LLAMA_API_KEY; SGLang reads none and runs behind the guard)
allow_unauthenticated_api = False  # True: accept a LAN api_host without api_key
controller_api_url = None  # where the controller reaches the API (status, bench); None = (ssh_hostname or name):api_port
max_model_len = 262144  # --max-model-len; refused above the model's maximum and where it cannot fit
gpu_memory_utilization = 0.88  # --gpu-memory-utilization; also the unit's pre-start memory check
# vLLM --kv-cache-memory-bytes: a fixed KV cache in bytes instead of what the share leaves after the weights; the
# share (gpu_memory_utilization, the memory plan's) is then derived: weights + reserve + this. Engines that share a
# Spark plan in bytes and start the same every time (unified memory's free figure moves); a service entry takes it too
kv_cache_memory_bytes = None
enable_prefix_caching = True  # --enable-prefix-caching (False: --no-enable-prefix-caching)
enable_auto_tool_choice = True  # --enable-auto-tool-choice (needs tool_call_parser)
tool_call_parser = "qwen3_coder"  # --tool-call-parser
reasoning_parser = "qwen3"  # --reasoning-parser
attention_backend = "FLASH_ATTN"  # --attention-backend
limit_mm_per_prompt = {"image": 0, "video": 0}  # --limit-mm-per-prompt: multimodal profiling off
kv_cache_dtype = "auto"  # --kv-cache-dtype; "fp8" is refused for hybrid models such as Qwen3.5
max_num_seqs = None  # --max-num-seqs; None = vLLM's default
tensor_parallel_size = 1  # GPUs the model is split over, one per Spark; above 1 only with tensor_parallel_hosts
# Two Sparks, one model (vLLM over Ray): list the members in every member's data (an inventory group's data is
# the usual place), the head first, and set tensor_parallel_size to their count and each member's fabric_address.
tensor_parallel_hosts = []  # the group's members, head first, e.g. ["spark-1", "spark-2"]; empty: a single host
fabric_interface = "enp1s0f0np0"  # the ConnectX-7 port the members are cabled on (NCCL, Gloo, UCX and Ray use it)
fabric_address = None  # this member's IPv4 address on the fabric; required for a member
fabric_mtu = 9000  # preflight checks it (it is reported to fall back to 1500 after a reboot)
ray_port = 6379  # the head's Ray port (GCS)
ray_start_args = []  # more `ray start` arguments, e.g. ["--num-cpus", "4"]; flags sparkfleet sets are refused
speculative_method = None  # "mtp": the model's own MTP layer drafts tokens (--speculative-config)
num_speculative_tokens = None  # draft tokens per step (1-8) with speculative_method (the MTP recipe: 2)
extra_engine_args = []  # more vLLM flags, each checked against the flag table; flags that open vLLM's admin
#                         surface or write prompts to the journal are refused
engine_env = {}  # secret: extra environment for the engine container, by allow-list: the pinned engine's reviewed
#                  variables and a few general ones (docs/settings.md, "Engine environment by allow-list")
sim_engine_knobs = False  # True only in the simulator's inventories: engine_env may set its stand-ins' SIM_* knobs
allow_trust_remote_code = False  # True: --trust-remote-code where the recipe says trust_remote_code (hub code as root)

# --- RAG services beside the chat model: each its own vLLM unit, port and model ---------------
# e.g. {"embed": {"recipe": "qwen3-embedding-0.6b"}, "rerank": {"recipe": "qwen3-reranker-0.6b"}}; any key of
# the recipe's [settings] may be overridden per service (api_port, gpu_memory_utilization, max_model_len, ...);
# a chat recipe's service may run on its own engine and image (a llama.cpp model beside vLLM: engine_image,
# llamacpp_version, model_files; docs/rag.md)
services = {}  # the pooling and other chat models this host serves beside its chat model, by name
gpu_memory_budget = 0.95  # the chat's gpu_memory_utilization + every service's must sum within this (OS keeps 6 GB)
# a service with on_demand = True is started by the first request naming it and stopped after this long without one
# (an entry's own on_demand_idle_s wins); it must fit beside every always-on engine, not beside the other on-demand
# ones: the least recently used of those is stopped first (docs/several-models.md)
on_demand_idle_s = 900
on_demand_max_waiting = 32  # requests a stopped on-demand model holds while it starts (and then at once); 503 past it
# an on-demand engine serves at least this long (from its first answer) before another's start may stop it for room:
# a start that needs its room waits (its requests held) for the rest, so models asked in turn swap at most once per
# this long, not on every request; 0: stopped at once (docs/several-models.md)
on_demand_min_resident_s = 300

# --- Planning: what the fit and speed estimates assume about a host ----------
# GB of a Spark's unified memory, what the fit plans each model in: 128, or 64 for a 64 GB DGX Spark (set it on that
# host; preflight refuses a host whose MemTotal is clearly below it)
host_memory_gb = 128
memory_bandwidth_gbs = 273  # a Spark's LPDDR5x bandwidth: bounds decode tokens/s

# --- Service ----------------------------------------------------------------
container_name = "vllm"  # the engine's fixed container name
docker_network = "host"  # "host", or a network name (then the port is published)
privileged = False  # opt-in: the reference write-up ran --privileged
seccomp_unconfined = False  # opt-in: the reference write-up ran seccomp=unconfined
gpu_device_mode = "runtime"  # "runtime": --gpus all (the toolkit's runtime hook); "cdi": --device
#                              nvidia.com/gpu=all from a CDI spec refreshed at boot (Docker 25 or later)
start_timeout_s = 1800  # systemd TimeoutStartSec: covers a first image pull
health_timeout_s = 900  # the health gate's timeout: a Spark takes 3-4 minutes to load this model
watchdog = True  # a timer probes the engine and restarts one that stopped answering
watchdog_interval_s = 30  # seconds between probes
watchdog_failures = 3  # failed probes in a row before a restart (never while the unit is starting)
watchdog_max_restarts = 3  # restarts allowed in watchdog_window_s; past that it gives up and logs an error
watchdog_window_s = 1800  # the window watchdog_max_restarts counts in

# --- Front door: HAProxy on the hosts of the inventory group `front_door` ----------
front_door_port = 8080  # one URL for the office: http(s)://<front door>:8080/v1
front_door_users = {}  # secret: {"name": "key"}; each user's own key (>= 16 characters), 0600 on the host;
#                       a value may be {"key": ..., "requests_per_minute": N, "max_concurrent": M} (limits of their own)
front_door_requests_per_minute = None  # fair share: a user's requests a minute before 429 (Retry-After: 60); None = no limit
front_door_max_concurrent = None  # fair share: a user's requests at once before 429 (Retry-After: 1); None = no limit
controller_front_door_url = None  # where the controller reaches it (status, bench); None = (ssh_hostname or name):port
controller_front_door_ca = None  # a PEM file status trusts for the front door's https; None = the system's CAs
front_door_tls_cert = None  # a PEM certificate on the controller: the front door speaks https
front_door_tls_key = None  # its private key on the controller (shipped 0600, never printed)
front_door_allow_http = False  # plain http with users (their keys in clear on the LAN): only on a trusted LAN
# how the door picks an engine for a chat (docs/front-door.md, "Routing"): "bounded" = a conversation's turns on one
# engine (its prefix cache) unless that engine holds 175 % of the average in flight; "hash" = affinity without a
# bound (before issue 54); "roundrobin" = no affinity
front_door_routing = "bounded"
# The fleet CA (made by `sparkfleet init`, beside the secrets): with a front door or a monitoring host, every hop to
# a host's guard is TLS with a certificate of this CA at both ends (docs/front-door.md); absolute controller paths
fleet_ca_cert = None  # its certificate (public)
fleet_ca_key = None  # its key (0600 on the controller; issues each host's certificate at converge, never shipped)
backend_key_in_clear = False  # True: the doors, Prometheus and status ask the guards over plain http, the backend key
#                               in clear on the LAN (what sparkfleet did before the fleet CA): only on a trusted LAN
# secret: {"name": "password"} (>= 16 characters): who may open the office status page, GET /status with HTTP
# Basic auth; offered where the front door host is also a `monitoring` host (0600 on it, as a SHA-256 only)
front_door_viewers = {}
# The chat UI for colleagues (docs/chat-ui.md): Open WebUI on the host of the inventory group `chat_ui` (one Spark),
# on a unix socket only its guard reaches, so only through each front door, where people sign in with their own key
chat_ui_image = "ghcr.io/open-webui/open-webui:v0.12.4"  # pinned by digest in the release lock at the first plan
chat_ui_port = 3000  # where browsers reach it on each front door: http(s)://<front door>:3000/
chat_ui_host_port = 8095  # its guard's port on its own host (the doors' only way in; Open WebUI on no port)
# Two or more doors, one address (docs/front-door.md, "Two doors, one address"): set only on the front_door group
front_door_address = None  # the floating IPv4 address with its prefix, e.g. "10.0.0.100/24"; None = one door, as before
front_door_address_preempt = False  # True: the address goes back to the first door once it is healthy again
front_door_vrrp_unicast = False  # True: VRRP to the other doors' LAN addresses (a network without multicast)
front_door_vrrp_router_id = None  # VRRP's router id (1-255); None = the floating address's last byte
front_door_peers_port = 10000  # HAProxy's peers (the shared per-user table), on each door's LAN address
drain_timeout_s = 120  # a rollout waits this long for a drained host's requests to finish
# a rollout's speed gate: the canary's decode tokens/s may fall, its TTFT rise, by this share of the previous
# release's at most (0.10: 10 %), else it is rolled back and the rollout halts (`--no-speed-gate` skips it)
rollout_max_regression = 0.10

# --- Answer quality: `sparkfleet eval` and the quality gate (docs/quality.md) ----------
# the probe suite (a file an office extends; a relative path is the project's): None = the one sparkfleet ships
quality_probes = None
# a model's score may fall this share under its release's baseline (0.05: 5 points of 100) before it counts as a
# regression; a probe that passed and now fails always counts
quality_margin = 0.05
# `sparkfleet eval --due` evaluates a host only when its last evaluation is this old (seconds, at least 3600): run
# it from the controller's cron or timer; 0 = off (the default: --due evaluates none)
quality_eval_interval_s = 0

# --- Monitoring: Prometheus on the hosts of the inventory group `monitoring` (loopback only) ----------
monitoring_port = 9090  # Prometheus on 127.0.0.1 of each monitoring host: reach it by an SSH tunnel or `status`
monitoring_retention = "15d"  # how long Prometheus keeps its samples (h, d, w or y)
monitoring_scrape_interval_s = 15  # seconds between scrapes (and rule evaluations)
monitoring_down_for_s = 60  # an engine not serving, or a front door backend down, this long fires an alert
monitoring_alert_for_s = 300  # KV cache full, requests waiting, a GB10 throttling or clocked low this long fires
monitoring_kv_cache_max = 0.9  # KV cache usage (1 = full) above which an engine counts as full
monitoring_waiting_requests_max = 8  # requests waiting in an engine's queue above which they pile up
monitoring_min_sm_clock_mhz = 1000  # a busy GB10's SM clock below this is clocked low (0: no such alert)
monitoring_drained_max_s = 86400  # a host drained at a front door longer than this fires an alert
alertmanager_port = 9093  # Alertmanager on 127.0.0.1 of a monitoring host, when alertmanager_webhook_url is set
alertmanager_webhook_url = None  # secret: where Alertmanager posts firing alerts; None = no Alertmanager

# --- Backups (docs/backups.md): the office's data off the box that holds it, kept by restic, encrypted ---
# the repository: None is the host of the group `backup` (an SFTP-only user there); or an office's own restic
# repository without credentials (sftp:USER@HOST:/PATH, rest:https://HOST:PORT/PATH, s3:HOST/BUCKET)
backup_repository = None
backup_interval_s = 3600  # the data hosts' timer (the chat UI's, the doors'): the restore point
backup_keep_hourly = 24  # retention, pruned after each good backup (restic forget --prune): hourly snapshots kept
backup_keep_daily = 7  # daily snapshots kept (the last of each day)
backup_keep_weekly = 4  # weekly snapshots kept (the last of each week)
# the office's one backup password on the controller (0600; `sparkfleet init` makes it and shows it once): every
# repository's password and key are derived from it; a restore on a new controller needs it and the inventory
controller_backup_password_file = None
