"""Prometheus on the monitoring hosts, built from the inventory: what it scrapes, the alerts it evaluates.

Every target is asked over the LAN the way the front door asks the engines: the host's guard (or the front
door's own port) with the backend key, which Prometheus reads from a 0600 file (contract/monitoring.py
PROMETHEUS_KEY), never from its config. Each target carries the label `host` (its inventory name), so every
series, and every alert, names the host it is about. The files are YAML written by a YAML-safe dump of plain
data: a host name or a setting can never add a line or a key.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from sparkfleet import FILES_DIR
from sparkfleet.contract import backup, engines
from sparkfleet.contract import monitoring as m
from sparkfleet.contract import paths
from sparkfleet.contract.settings import Settings, SettingsError
from sparkfleet.roles import haproxy, pki
from sparkfleet.contract.monitoring import FRONT_DOOR_GROUP as FRONT_DOOR
from sparkfleet.roles.desired import Command, DesiredState, Directory, File, HttpWait, Packages, Unit, desired, secret
from sparkfleet.roles.status_page import console_files, prometheus_flags
from sparkfleet.release import render
from sparkfleet.release.plan import HostPlan

JOBS = (m.JOB_ENGINE, m.JOB_NODE, m.JOB_FRONT_DOOR, m.JOB_USAGE)  # the scrape jobs, by what they reach
DOOR_JOBS = (m.JOB_FRONT_DOOR, m.JOB_USAGE)  # asked on a front door's port (https where the door speaks it)
# Every engine's KV cache gauge (0..1; vLLM's new name, its old one, SGLang's token_usage; llama.cpp exports
# none) and its queue: one alert covers a fleet of mixed engines, each series keeping its `host`.
KV_CACHE = engines.kv_usage_series()
WAITING = engines.every("waiting")


@dataclass(frozen=True)
class Target:
    job: str
    host: str  # the inventory name: the label `host`
    address: str  # host:port
    service: str = ""  # the RAG service's name, "" for the chat engine (and other jobs)


def targets(plans: dict[str, HostPlan], groups: dict[str, set[str]]) -> list[Target]:
    """What a monitoring host scrapes: per host with a guard, each engine's /metrics and the node exporter; per
    front door host, HAProxy's exporter and the per-user usage. `groups`: each host's inventory groups. A
    tensor-parallel worker runs no guard (no engine API), so neither of its exporters is in reach; service hosts
    (only in front_door and monitoring) run no engine."""
    found, problems = [], []
    for name, p in sorted(plans.items()):
        s, address = p.settings, p.lan_address
        engines = ([("", s.api_port)] if p.runs_engine else []) + [(svc.name, svc.service.api_port)
                                                                   for svc in p.services]
        if engines:  # a service host's plan has none
            if s.api_is_loopback:
                problems.append(f"{name}: api_host {s.api_host} is loopback, out of Prometheus's reach: set "
                                "api_host to a LAN address (or 0.0.0.0) with an api_key")
            if s.api_key is None:
                problems.append(f"{name}: setting `api_key` is missing: Prometheus asks the engines with it")
            try:
                # an on-demand model's /metrics is not scraped: a scrape every few seconds would keep it from idling
                on_demand = {svc.name for svc in p.services if svc.on_demand}
                found += [Target(m.JOB_ENGINE, name, haproxy.address(address, port), svc) for svc, port in engines
                          if svc not in on_demand]
                found.append(Target(m.JOB_NODE, name, haproxy.address(address, engines[0][1])))  # the guard's first
            except ValueError as exc:
                problems.append(f"{name}: lan_address (or ssh_hostname, or the host's name): {exc}: "
                                "fix it in the inventory")
        if FRONT_DOOR in groups.get(name, set()):
            try:
                door = haproxy.address(address, s.front_door_port)
                found += [Target(job, name, door) for job in DOOR_JOBS]
            except ValueError as exc:
                problems.append(f"{name}: lan_address (or ssh_hostname, or the host's name): {exc}: "
                                "fix it in the inventory")
    keys = {plans[t.host].settings.api_key for t in found if t.job == m.JOB_ENGINE}
    if len(keys) > 1:
        problems.append("the hosts Prometheus scrapes have different `api_key`s: it sends one; set one api_key "
                        "for them all (e.g. in group_data)")
    if problems:
        raise SettingsError(problems)
    return found


def backend_key(plans: dict[str, HostPlan], found: list[Target]) -> str:
    """The one backend key the scrapes send (what the PROMETHEUS_KEY file holds)."""
    return next((plans[t.host].settings.api_key for t in found if t.job == m.JOB_ENGINE), None) or ""


def _dump(data) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=False, width=1000)


GUARD_TLS = {"ca_file": paths.TLS_CA, "cert_file": paths.TLS_HOST_CERT, "key_file": m.PROMETHEUS_TLS_KEY,
             "insecure_skip_verify": False}  # the guards' jobs over TLS: the fleet CA both ways (roles/pki.py)


def scrape_config(s: Settings, found: list[Target], tls_doors: set[str] = frozenset(),
                  alertmanager: bool = False, backend_tls: bool = False) -> str:
    """prometheus.yml: one job per kind of target, each target labelled with its host (and service). The guards'
    jobs (engine, node) are https with this host's certificate where the fleet's hops are TLS (`backend_tls`):
    Prometheus verifies the guard's chain with the fleet CA and its name (the target's lan_address, which each
    host's certificate names); a door's jobs are https where that door speaks it."""
    paths = {m.JOB_ENGINE: m.ENGINE_METRICS_PATH, m.JOB_NODE: m.NODE_METRICS_PATH,
             m.JOB_FRONT_DOOR: m.FRONT_DOOR_METRICS_PATH, m.JOB_USAGE: m.USAGE_METRICS_PATH}
    jobs = []
    for job in JOBS:
        mine = [t for t in found if t.job == job]
        if not mine:
            continue
        for scheme in ("http", "https"):
            door = job in DOOR_JOBS
            of_scheme = [t for t in mine if (t.host in tls_doors if door else backend_tls) == (scheme == "https")]
            if not of_scheme:
                continue
            tls_config = {"insecure_skip_verify": False} if door else GUARD_TLS
            jobs.append({
                "job_name": f"{job}_tls" if door and scheme == "https" else job, "metrics_path": paths[job],
                "scheme": scheme, "authorization": {"type": "Bearer", "credentials_file": m.PROMETHEUS_KEY},
                **({"tls_config": tls_config} if scheme == "https" else {}),
                "static_configs": [{"targets": [t.address],
                                    "labels": {"host": t.host, **({"service": t.service} if t.service else {})}}
                                   for t in of_scheme]})
    interval = f"{s.monitoring_scrape_interval_s}s"
    config = {"global": {"scrape_interval": interval, "evaluation_interval": interval,
                         "scrape_timeout": f"{min(10, s.monitoring_scrape_interval_s)}s"},
              "rule_files": [m.PROMETHEUS_RULES], "scrape_configs": jobs}
    if alertmanager:
        config["alerting"] = {"alertmanagers": [{"static_configs": [
            {"targets": [f"127.0.0.1:{s.alertmanager_port}"]}]}]}
    return _dump(config)


def _for(seconds: int) -> str:
    return f"{seconds}s"


def _alert(name: str, expr: str, for_s: int, summary: str) -> dict:
    return {"alert": name, "expr": expr, "for": _for(for_s), "labels": {"severity": "warning"},
            "annotations": {"summary": "{{ $labels.host }}: " + summary}}


def _benign() -> str:
    return "|".join(m.BENIGN_THROTTLE_REASONS)


def rules(s: Settings) -> list[dict]:
    """The alerts, each naming the host its series carry (label `host`)."""
    kv = " or ".join(f"{name} > {s.monitoring_kv_cache_max!r}" for name in KV_CACHE)
    drained = ('label_replace(label_replace(haproxy_server_status{job=~"front_door(_tls)?",state="MAINT"} == 1, '
               '"front_door", "$1", "host", "(.*)"), "host", "$1", "server", "(.*)")')
    down = drained.replace('"MAINT"', '"DOWN"')
    alerts = [
        _alert("EngineNotServing", 'up{job="engine"} == 0 or sparkfleet_watchdog_probe_ok == 0',
               s.monitoring_down_for_s, "an engine is down or not serving"),
        _alert("NodeExporterDown", 'up{job="node"} == 0', s.monitoring_down_for_s,
               "its node exporter does not answer (the host, or its guard, is down)"),
        _alert("TlsCertificateExpiring",
               f"{pki.EXPIRY_METRIC} - time() < {pki.ALERT_BEFORE_DAYS * 86400}", 3600,
               f"its fleet TLS certificate ends within {pki.ALERT_BEFORE_DAYS} days: converge it (the converge "
               "re-issues one within 30 days of its end)"),
        _alert("WatchdogGaveUp", "sparkfleet_watchdog_gave_up == 1", 0,
               "the watchdog gave up restarting {{ $labels.unit }}"),
        _alert("QualityBelowBaseline", f"{m.QUALITY_BELOW_METRIC} == 1", 0,
               "{{ $labels.model }} answered below its release's baseline at its last evaluation: `sparkfleet eval`"),
        _alert("BackupOverdue", f"time() - {backup.METRIC_LAST_SUCCESS} > {backup.STALE_FACTOR} * "
               f"{backup.METRIC_INTERVAL}", 0, f"{{{{ $labels.source }}}}'s last good backup is older than "
               f"{backup.STALE_FACTOR} intervals: `journalctl -u {backup.UNIT}` there, `sparkfleet backup`"),
        _alert("BackupFailed", f"{backup.METRIC_LAST_RUN_OK} == 0", 0,
               f"the last backup of {{{{ $labels.source }}}} failed (older snapshots are kept): `journalctl -u "
               f"{backup.UNIT}` there"),
        _alert("KvCacheFull", kv, s.monitoring_alert_for_s,
               f"KV cache usage above {s.monitoring_kv_cache_max:.0%}"),
        _alert("RequestsPilingUp", " or ".join(f"{name} > {s.monitoring_waiting_requests_max}" for name in WAITING),
               s.monitoring_alert_for_s, f"more than {s.monitoring_waiting_requests_max} requests waiting"),
        _alert("MemoryRunningOut", 'predict_linear(node_memory_MemAvailable_bytes{job="node"}[30m], 3600) <= 0',
               s.monitoring_alert_for_s, "memory available trends to zero within the hour"),
        _alert("GpuThrottling", f'sparkfleet_gpu_throttle_active{{reason!~"{_benign()}"}} == 1',
               s.monitoring_alert_for_s, "the GB10 is throttling ({{ $labels.reason }})"),
        _alert("FrontDoorBackendDown", down, s.monitoring_down_for_s,
               "down at the front door on {{ $labels.front_door }}"),
        _alert("HostDrainedTooLong", drained, s.monitoring_drained_max_s,
               "drained at the front door on {{ $labels.front_door }} for over "
               f"{s.monitoring_drained_max_s}s"),
    ]
    if s.monitoring_min_sm_clock_mhz:
        alerts.insert(-2, _alert(
            "GpuClockLow", f"sparkfleet_gpu_sm_clock_mhz < {s.monitoring_min_sm_clock_mhz} unless on (host) "
            'sparkfleet_gpu_throttle_active{reason="gpu_idle"} == 1', s.monitoring_alert_for_s,
            f"the GB10's SM clock is below {s.monitoring_min_sm_clock_mhz} MHz while busy"))
    return alerts


def rules_file(s: Settings) -> str:
    """alerts.yml: one group of the rules above."""
    return _dump({"groups": [{"name": "sparkfleet", "rules": rules(s)}]})


def alertmanager_config(url: str) -> str:
    """alertmanager.yml: every alert to one webhook (the URL is a secret: this file is 0600)."""
    return _dump({"route": {"receiver": "webhook", "group_by": ["alertname", "host"]},
                  "receivers": [{"name": "webhook", "webhook_configs": [{"url": url, "send_resolved": True}]}]})


TEXTFILE_INTERVAL_S = 15  # how often the timer reads the GB10 and the watchdog


@dataclass(frozen=True)
class Monitoring:
    """What one monitoring host runs: Prometheus's config, rules and key, its unit, and Alertmanager's."""

    host: str
    settings: Settings
    targets: tuple[Target, ...]
    key: str
    tls_doors: frozenset[str] = frozenset()
    backend_tls: bool = False  # the guards serve TLS: scrape them with this host's certificate

    @property
    def alertmanager(self) -> bool:
        return self.settings.alertmanager_webhook_url is not None

    def config(self) -> str:
        return scrape_config(self.settings, list(self.targets), set(self.tls_doors), self.alertmanager,
                             self.backend_tls)

    def rules(self) -> str:
        return rules_file(self.settings)

    def unit(self) -> str:
        return render._templates.get_template("sparkfleet-prometheus.service.j2").render(
            s=self.settings, config=m.PROMETHEUS_CONFIG, data=m.PROMETHEUS_DATA, user=m.PROMETHEUS_USER,
            listen=f"127.0.0.1:{self.settings.monitoring_port}", consoles=prometheus_flags())

    def alertmanager_config(self) -> str:
        return alertmanager_config(self.settings.alertmanager_webhook_url)

    def alertmanager_unit(self) -> str:
        return render._templates.get_template("sparkfleet-alertmanager.service.j2").render(
            config=m.ALERTMANAGER_CONFIG, data=m.ALERTMANAGER_DATA, user=m.PROMETHEUS_USER,
            listen=f"127.0.0.1:{self.settings.alertmanager_port}")


def monitoring_plan(host: str, plans: dict[str, HostPlan], groups: dict[str, set[str]]) -> Monitoring:
    """The monitoring on `host`, from the whole inventory's plans and each host's groups (SettingsError names
    every problem)."""
    s = plans[host].settings
    found = targets(plans, groups)
    if s.monitoring_port in (s.api_port, s.front_door_port, s.peer_port, s.alertmanager_port):
        raise SettingsError([f"{host}: setting `monitoring_port` = {s.monitoring_port} is taken by another "
                             "listener on this host: pick another port"])
    tls = frozenset(t.host for t in found if t.job == m.JOB_FRONT_DOOR and plans[t.host].settings.front_door_tls_cert)
    return Monitoring(host, s, tuple(found), backend_key(plans, found), tls, plans[host].backend_tls)


def node_exporter_unit() -> str:
    return render._templates.get_template("sparkfleet-node-exporter.service.j2").render(
        listen=f"127.0.0.1:{m.NODE_EXPORTER_PORT}", textfile_dir=m.TEXTFILE_DIR, user=m.PROMETHEUS_USER,
        path=m.NODE_METRICS_PATH)


def textfile_units() -> tuple[str, str]:
    """The textfile writer's service and timer."""
    t = render._templates
    return (t.get_template("sparkfleet-textfile.service.j2").render(
                textfile=m.TEXTFILE, serving=paths.SERVING_FILE, textfile_dir=m.TEXTFILE_DIR),
            t.get_template("sparkfleet-textfile.timer.j2").render(interval_s=TEXTFILE_INTERVAL_S))


# --- what the stages ensure (roles/desired.py) ----------------------------------------------------------------


def _masked_install(package: str, what: str, why: str) -> tuple[Packages, Unit]:
    """A Debian package whose own unit (which Debian starts at the install, on every address) is masked before
    apt runs, so it never starts, and kept off: sparkfleet runs its own unit."""
    debian_unit = paths.MONITORING_PACKAGES[package]
    return (Packages(f"{what} installed (Debian's unit masked first: it never starts)",
                     (package,), masked=(debian_unit,), extra_install_args="--no-install-recommends"),
            Unit(debian_unit, f"Debian's {debian_unit} off ({why})", running=False, enabled=False))


def monitoring_state(host: str, plans: dict[str, HostPlan], groups: dict[str, set[str]]) -> DesiredState:
    """What the monitoring stage ensures on `host`: Prometheus from Debian's package under its own unit on
    127.0.0.1, its files (the key and, over TLS, this host's key as its own 0600 copies: it runs as prometheus), the
    status page, and Alertmanager where `alertmanager_webhook_url` is set. A changed config or rule file is checked
    with promtool and reloaded; a changed unit is a restart; ready before the host counts as converged.
    SettingsError as `monitoring_plan` (or the fleet CA's)."""
    wanted = monitoring_plan(host, plans, groups)
    s, owner = wanted.settings, (m.PROMETHEUS_USER, m.PROMETHEUS_USER)
    tls_key = pki.host_key_pem(pki.ca_of(s), host) if wanted.backend_tls else None
    files = (m.PROMETHEUS_RULES, m.PROMETHEUS_CONFIG)
    return desired(
        _masked_install(m.PROMETHEUS_PACKAGE, "Prometheus", "sparkfleet runs its own, on loopback"),
        Directory(m.PROMETHEUS_DIR, "Prometheus config directory", mode="0750", owner=("root", m.PROMETHEUS_USER)),
        Directory(m.PROMETHEUS_DATA, "Prometheus data directory", mode="0750", owner=owner),
        secret(m.PROMETHEUS_KEY, "Prometheus's backend key (0600)", wanted.key + "\n", owner=owner),
        secret(m.PROMETHEUS_TLS_KEY, "Prometheus's TLS key (0600)", tls_key, owner=owner) if tls_key else None,
        File(m.PROMETHEUS_RULES, "Prometheus alert rules", content=wanted.rules()),
        File(m.PROMETHEUS_CONFIG, "Prometheus config", content=wanted.config()),
        Command("Prometheus config and rules pass promtool",
                f"promtool check config --syntax-only {m.PROMETHEUS_CONFIG} >/dev/null && "
                f"promtool check rules {m.PROMETHEUS_RULES} >/dev/null", when=files),
        # the office status page: Prometheus reads a console template at each request (a change needs no reload)
        Directory(m.PROMETHEUS_CONSOLES, "Prometheus consoles (the status page)"),
        Directory(m.PROMETHEUS_CONSOLE_LIBRARIES, "Prometheus console libraries (none needed)"),
        [File(dest, "The status page (a console template)", content=text) for dest, text in console_files().items()],
        _alertmanager_state(wanted) if wanted.alertmanager else None,
        File(m.PROMETHEUS_UNIT_PATH, "Prometheus unit", content=wanted.unit()),
        Unit(m.PROMETHEUS_UNIT_NAME, f"Prometheus on 127.0.0.1:{s.monitoring_port}",
             restart_on=(m.PROMETHEUS_UNIT_PATH,), reload_on=(*files, m.PROMETHEUS_KEY),
             daemon_reload_on=(m.PROMETHEUS_UNIT_PATH,)),
        HttpWait("Prometheus is ready", f"http://127.0.0.1:{s.monitoring_port}{m.PROMETHEUS_READY_PATH}",
                 s.health_timeout_s, 2, f"Prometheus is not ready after {s.health_timeout_s}s",
                 when=(m.PROMETHEUS_UNIT_NAME, m.PROMETHEUS_UNIT_PATH)))


def _alertmanager_state(wanted: Monitoring) -> DesiredState:
    """Alertmanager (Debian's package, its own unit on loopback, no cluster port): every alert to the webhook,
    whose URL is a secret (a 0600 file owned by prometheus, never in the plan or the unit)."""
    owner = (m.PROMETHEUS_USER, m.PROMETHEUS_USER)
    return desired(
        _masked_install(m.ALERTMANAGER_PACKAGE, "Alertmanager", "it listens on every address"),
        Directory(m.ALERTMANAGER_DIR, "Alertmanager config directory", mode="0750",
                  owner=("root", m.PROMETHEUS_USER)),
        Directory(m.ALERTMANAGER_DATA, "Alertmanager data directory", mode="0750", owner=owner),
        secret(m.ALERTMANAGER_CONFIG, "Alertmanager config (0600: its webhook)", wanted.alertmanager_config(),
               owner=owner),
        File(m.ALERTMANAGER_UNIT_PATH, "Alertmanager unit", content=wanted.alertmanager_unit()),
        Unit(m.ALERTMANAGER_UNIT_NAME, f"Alertmanager on 127.0.0.1:{wanted.settings.alertmanager_port}",
             restart_on=(m.ALERTMANAGER_UNIT_PATH,), reload_on=(m.ALERTMANAGER_CONFIG,),
             daemon_reload_on=(m.ALERTMANAGER_UNIT_PATH,)))


def node_metrics_state(cert: str | None) -> DesiredState:
    """What the node_metrics stage ensures on a Spark: Debian's node exporter under its own unit on loopback (the
    LAN reaches it only through the guard's NODE_METRICS_PATH, with the backend key), and a timer writing the GB10's
    and the watchdog's state for its textfile collector; with this host's fleet certificate in force (`cert`), when
    it ends (the alert TlsCertificateExpiring). A changed unit is a restart."""
    service, timer = textfile_units()
    reader, timer_path = paths.unit_path(m.TEXTFILE_UNIT), paths.unit_path(m.TEXTFILE_TIMER)
    return desired(
        _masked_install(m.NODE_EXPORTER_PACKAGE, "Node exporter", "it listens on every address"),
        Directory(m.TEXTFILE_DIR, "Textfile collector directory"),
        File(paths.TLS_EXPIRY_TEXTFILE, "This host's certificate expiry (textfile)",
             content=pki.expiry_metric(cert)) if cert else None,
        File(m.TEXTFILE, "Helper sparkfleet-textfile", src=str(FILES_DIR / "sparkfleet-textfile"), mode="0755"),
        File(reader, "Textfile unit", content=service),
        File(timer_path, "Textfile timer", content=timer),
        Unit(m.TEXTFILE_TIMER, "Textfile timer on", restart_on=(timer_path, reader, m.TEXTFILE),
             daemon_reload_on=(timer_path, reader)),
        File(m.NODE_EXPORTER_UNIT_PATH, "Node exporter unit", content=node_exporter_unit()),
        Unit(m.NODE_EXPORTER_UNIT_NAME, "Node exporter on 127.0.0.1", restart_on=(m.NODE_EXPORTER_UNIT_PATH,),
             daemon_reload_on=(m.NODE_EXPORTER_UNIT_PATH,)))
