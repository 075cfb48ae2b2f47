"""Prometheus's files from the inventory: every engine, node exporter and front door scraped with the backend key
from a file, each series labelled with its host; the alert rules pass promtool, and each alert fires in one case
and stays quiet in another (promtool test rules); nothing a host name or setting holds can bend the YAML."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from sparkfleet.contract import backup
from sparkfleet.contract import monitoring as m
from sparkfleet.contract.settings import GROUPS_KEY, SettingsError, parse_settings
from sparkfleet.roles import monitoring
from sparkfleet.release.plan import plan_hosts

from .helpers import KEY, host_data

GROUPS = {"spark-1": {"all", "sparks", "front_door", "monitoring"}, "spark-2": {"all", "sparks"}, "spark-3": {"all"}}


def plans(**data):
    base = {"api_host": "0.0.0.0", "api_key": KEY, **data}
    return {p.name: p for p in plan_hosts([(f"spark-{n}", host_data(**base, ssh_hostname=f"10.0.0.{n}"))
                                           for n in (1, 2, 3)])}


def test_every_engine_node_exporter_and_front_door_is_a_target_labelled_with_its_host():
    found = monitoring.targets(plans(), GROUPS)
    assert {(t.job, t.host, t.address) for t in found} == {
        *((job, f"spark-{n}", f"10.0.0.{n}:8000") for n in (1, 2, 3) for job in ("engine", "node")),
        ("front_door", "spark-1", "10.0.0.1:8080"), ("usage", "spark-1", "10.0.0.1:8080")}
    config = yaml.safe_load(monitoring.scrape_config(parse_settings("spark-1", host_data()), found))
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert {name: j["metrics_path"] for name, j in jobs.items()} == {
        "engine": "/metrics", "node": "/node/metrics", "front_door": "/haproxy/metrics", "usage": "/usage/metrics"}
    assert all(j["authorization"] == {"type": "Bearer", "credentials_file": m.PROMETHEUS_KEY} for j in jobs.values())
    assert jobs["node"]["static_configs"][1] == {"targets": ["10.0.0.2:8000"], "labels": {"host": "spark-2"}}
    assert KEY not in monitoring.scrape_config(parse_settings("spark-1", host_data()), found)
    assert monitoring.backend_key(plans(), found) == KEY


def test_a_service_host_is_scraped_as_a_front_door_only_and_a_loopback_engine_is_refused():
    groups = {**GROUPS, "spark-3": {"all", "front_door"}}
    door = plan_hosts([("spark-3", host_data(api_host="0.0.0.0", api_key=KEY, ssh_hostname="10.0.0.3",
                                             backend_key_in_clear=True, **{GROUPS_KEY: ["front_door"]}))])[0]
    found = monitoring.targets({**plans(), "spark-3": door}, groups)
    assert {t.job for t in found if t.host == "spark-3"} == {"front_door", "usage"}
    with pytest.raises(SettingsError, match="spark-2: api_host 127.0.0.1 is loopback"):
        monitoring.targets({**plans(), "spark-2": plans(api_host="127.0.0.1")["spark-2"]}, GROUPS)
    with pytest.raises(SettingsError, match="different `api_key`s"):
        monitoring.targets({**plans(), "spark-2": plans(api_key="another-key-0123")["spark-2"]}, GROUPS)


def test_hostile_values_never_bend_the_yaml():
    """A host name, a label or a URL with YAML syntax stays one string where it lands."""
    hostile = "evil\n- job_name: x\n  # {{ $value }}: 'a'"
    found = [monitoring.Target("engine", hostile, "10.0.0.9:8000", "rag: [1]")]
    config = yaml.safe_load(monitoring.scrape_config(parse_settings("spark-1", host_data()), found))
    assert [j["job_name"] for j in config["scrape_configs"]] == ["engine"]
    assert config["scrape_configs"][0]["static_configs"][0]["labels"] == {"host": hostile, "service": "rag: [1]"}
    url = "https://hooks.example/a'b: c"
    assert yaml.safe_load(monitoring.alertmanager_config(url))["receivers"][0]["webhook_configs"][0]["url"] == url


@pytest.mark.parametrize("key, value", [("monitoring_retention", "15d\nrule_files: [/etc/shadow]"),
                                        ("monitoring_retention", "0d"), ("monitoring_retention", "15days"),
                                        ("monitoring_kv_cache_max", 1.5), ("monitoring_scrape_interval_s", 1),
                                        ("alertmanager_webhook_url", "http://h/x\nroute: {}"),
                                        ("monitoring_port", 0), ("monitoring_down_for_s", -1),
                                        ("monitoring_alert_for_s", "5m; rm -rf /"),
                                        ("monitoring_waiting_requests_max", -1), ("monitoring_drained_max_s", 10),
                                        ("monitoring_min_sm_clock_mhz", 100000), ("alertmanager_port", 70000),
                                        ("service_min_memory_gib", -1), ("service_min_disk_gib", "2G"),
                                        ("front_door_max_concurrent", 0),
                                        ("front_door_requests_per_minute", "4/m")])
def test_settings_that_would_break_a_file_or_a_flag_are_refused(key, value):
    with pytest.raises(SettingsError, match=key):
        parse_settings("spark-1", host_data(**{key: value}))


def test_every_sparkfleet_metric_the_rules_read_is_one_the_contract_names():
    text = monitoring.rules_file(parse_settings("spark-1", host_data()))
    used = set(re.findall(r"sparkfleet_[a-z_]+", text))
    assert used and used <= {*m.GPU_METRICS, *m.WATCHDOG_METRICS, *m.TLS_METRICS, *m.QUALITY_METRICS,
                             *backup.METRICS}
    assert all(reason in text for reason in m.BENIGN_THROTTLE_REASONS)


def test_no_clock_alert_when_its_threshold_is_zero():
    names = [r["alert"] for r in monitoring.rules(parse_settings("spark-1", host_data(monitoring_min_sm_clock_mhz=0)))]
    assert "GpuClockLow" not in names and "GpuThrottling" in names


@pytest.mark.prometheus
def test_promtool_checks_the_config_and_the_rules(tmp_path):
    s = parse_settings("spark-1", host_data())
    (tmp_path / "alerts.yml").write_text(monitoring.rules_file(s))
    (tmp_path / "key").write_text(KEY)
    text = monitoring.scrape_config(s, monitoring.targets(plans(), GROUPS), alertmanager=True)
    text = text.replace(m.PROMETHEUS_RULES, str(tmp_path / "alerts.yml")).replace(m.PROMETHEUS_KEY,
                                                                                  str(tmp_path / "key"))
    (tmp_path / "prometheus.yml").write_text(text)
    for args in (["check", "config", "prometheus.yml"], ["check", "rules", "alerts.yml"]):
        done = subprocess.run(["promtool", *args], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


def _alert(name, summary, **labels):
    return {"exp_labels": {"severity": "warning", **labels}, "exp_annotations": {"summary": summary}}


def _case(name, interval, eval_time, series, *firing):
    return {"interval": interval, "input_series": [{"series": k, "values": v} for k, v in series.items()],
            "alert_rule_test": [{"eval_time": eval_time, "alertname": name, "exp_alerts": list(firing)}]}


# Per alert: spark-2 fires, the others' series stay quiet (the test lists every alert it expects).
CASES = [
    _case("EngineNotServing", "1m", "5m", {
        'up{job="engine",host="spark-2",instance="a"}': "0x10", 'up{job="engine",host="spark-1",instance="b"}': "1x10",
        'sparkfleet_watchdog_probe_ok{job="node",host="spark-3",unit="u"}': "1x10"},
        _alert("EngineNotServing", "spark-2: an engine is down or not serving", job="engine", host="spark-2",
               instance="a")),
    _case("EngineNotServing", "1m", "5m", {
        'sparkfleet_watchdog_probe_ok{job="node",host="spark-2",unit="u"}': "0x10",
        'sparkfleet_watchdog_probe_ok{job="node",host="spark-1",unit="u"}': "1 1 0 1 1 1"},
        _alert("EngineNotServing", "spark-2: an engine is down or not serving", job="node", host="spark-2",
               unit="u")),
    _case("NodeExporterDown", "1m", "5m", {
        'up{job="node",host="spark-2"}': "0x10", 'up{job="node",host="spark-1"}': "1x10"},
        _alert("NodeExporterDown", "spark-2: its node exporter does not answer (the host, or its guard, is down)",
               job="node", host="spark-2")),
    _case("WatchdogGaveUp", "1m", "2m", {
        'sparkfleet_watchdog_gave_up{job="node",host="spark-2",unit="u"}': "1x5",
        'sparkfleet_watchdog_gave_up{job="node",host="spark-1",unit="u"}': "0x5"},
        _alert("WatchdogGaveUp", "spark-2: the watchdog gave up restarting u", job="node", host="spark-2", unit="u")),
    _case("QualityBelowBaseline", "1m", "2m", {
        'sparkfleet_quality_below_baseline{job="node",host="spark-2",model="m"}': "1x5",
        'sparkfleet_quality_below_baseline{job="node",host="spark-1",model="m"}': "0x5"},
        _alert("QualityBelowBaseline", "spark-2: m answered below its release's baseline at its last evaluation: "
               "`sparkfleet eval`", job="node", host="spark-2", model="m")),
    # promtool's time() starts at 0: spark-2's last good backup stays at 0 (older than 2 x 60 s by 5m), spark-1's
    # follows the clock
    _case("BackupOverdue", "1m", "5m", {
        'sparkfleet_backup_last_success_timestamp_seconds{job="node",host="spark-2",source="chat-ui"}': "0x10",
        'sparkfleet_backup_interval_seconds{job="node",host="spark-2",source="chat-ui"}': "60x10",
        'sparkfleet_backup_last_success_timestamp_seconds{job="node",host="spark-1",source="usage-d"}': "0+60x10",
        'sparkfleet_backup_interval_seconds{job="node",host="spark-1",source="usage-d"}': "60x10"},
        _alert("BackupOverdue", "spark-2: chat-ui's last good backup is older than 2 intervals: `journalctl -u "
               "sparkfleet-backup.service` there, `sparkfleet backup`", job="node", host="spark-2", source="chat-ui")),
    _case("BackupFailed", "1m", "2m", {
        'sparkfleet_backup_last_run_ok{job="node",host="spark-2",source="chat-ui"}': "0x5",
        'sparkfleet_backup_last_run_ok{job="node",host="spark-1",source="usage-d"}': "1x5"},
        _alert("BackupFailed", "spark-2: the last backup of chat-ui failed (older snapshots are kept): `journalctl "
               "-u sparkfleet-backup.service` there", job="node", host="spark-2", source="chat-ui")),
    _case("TlsCertificateExpiring", "1m", "2h", {  # promtool's time() starts at 0: 10 days left, and 60
        'sparkfleet_tls_cert_expiry_seconds{job="node",host="spark-2"}': "864000x150",
        'sparkfleet_tls_cert_expiry_seconds{job="node",host="spark-1"}': "5184000x150"},
        _alert("TlsCertificateExpiring", "spark-2: its fleet TLS certificate ends within 14 days: converge it (the "
               "converge re-issues one within 30 days of its end)", job="node", host="spark-2")),
    _case("KvCacheFull", "1m", "10m", {
        'vllm:kv_cache_usage_perc{job="engine",host="spark-2"}': "0.95x12",
        'vllm:gpu_cache_usage_perc{job="engine",host="spark-3"}': "0.95x12",
        'vllm:kv_cache_usage_perc{job="engine",host="spark-1"}': "0.5x12"},
        _alert("KvCacheFull", "spark-2: KV cache usage above 90%", job="engine", host="spark-2"),
        _alert("KvCacheFull", "spark-3: KV cache usage above 90%", job="engine", host="spark-3")),
    _case("RequestsPilingUp", "1m", "10m", {
        'vllm:num_requests_waiting{job="engine",host="spark-2"}': "20x12",
        'vllm:num_requests_waiting{job="engine",host="spark-1"}': "2x12"},
        _alert("RequestsPilingUp", "spark-2: more than 8 requests waiting", job="engine", host="spark-2")),
    # the other engines' series: SGLang's KV gauge and queue, llama.cpp's deferred requests (it has no KV gauge)
    _case("KvCacheFull", "1m", "10m", {
        'sglang:token_usage{job="engine",host="spark-2",model_name="m"}': "0.95x12",
        'sglang:token_usage{job="engine",host="spark-1",model_name="m"}': "0.5x12",
        'vllm:kv_cache_usage_perc{job="engine",host="spark-3"}': "0.5x12"},
        _alert("KvCacheFull", "spark-2: KV cache usage above 90%", job="engine", host="spark-2", model_name="m")),
    _case("RequestsPilingUp", "1m", "10m", {
        'sglang:num_queue_reqs{job="engine",host="spark-2",model_name="m"}': "20x12",
        'llamacpp:requests_deferred{job="engine",host="spark-3"}': "30x12",
        'llamacpp:requests_deferred{job="engine",host="spark-4"}': "1x12",
        'vllm:num_requests_waiting{job="engine",host="spark-1"}': "2x12"},
        _alert("RequestsPilingUp", "spark-2: more than 8 requests waiting", job="engine", host="spark-2",
               model_name="m"),
        _alert("RequestsPilingUp", "spark-3: more than 8 requests waiting", job="engine", host="spark-3")),
    _case("MemoryRunningOut", "1m", "40m", {
        'node_memory_MemAvailable_bytes{job="node",host="spark-2"}': "100000000000-2000000000x45",
        'node_memory_MemAvailable_bytes{job="node",host="spark-1"}': "100000000000+0x60"},
        _alert("MemoryRunningOut", "spark-2: memory available trends to zero within the hour", job="node",
               host="spark-2")),
    _case("GpuThrottling", "1m", "10m", {
        'sparkfleet_gpu_throttle_active{job="node",host="spark-2",reason="sw_power_cap"}': "1x12",
        'sparkfleet_gpu_throttle_active{job="node",host="spark-1",reason="gpu_idle"}': "1x12",
        'sparkfleet_gpu_throttle_active{job="node",host="spark-3",reason="hw_slowdown"}': "0x12"},
        _alert("GpuThrottling", "spark-2: the GB10 is throttling (sw_power_cap)", job="node", host="spark-2",
               reason="sw_power_cap")),
    _case("GpuClockLow", "1m", "10m", {
        'sparkfleet_gpu_sm_clock_mhz{job="node",host="spark-2"}': "850x12",
        'sparkfleet_gpu_throttle_active{job="node",host="spark-2",reason="gpu_idle"}': "0x12",
        'sparkfleet_gpu_sm_clock_mhz{job="node",host="spark-1"}': "208x12",
        'sparkfleet_gpu_throttle_active{job="node",host="spark-1",reason="gpu_idle"}': "1x12",
        'sparkfleet_gpu_sm_clock_mhz{job="node",host="spark-3"}': "2400x12"},
        _alert("GpuClockLow", "spark-2: the GB10's SM clock is below 1000 MHz while busy", job="node",
               host="spark-2")),
    _case("FrontDoorBackendDown", "1m", "5m", {
        'haproxy_server_status{job="front_door",host="spark-1",proxy="engines",server="spark-2",state="DOWN"}': "1x10",
        'haproxy_server_status{job="front_door",host="spark-1",proxy="engines",server="spark-3",state="DOWN"}': "0x10"},
        _alert("FrontDoorBackendDown", "spark-2: down at the front door on spark-1", job="front_door",
               host="spark-2", front_door="spark-1", proxy="engines", server="spark-2", state="DOWN")),
    _case("HostDrainedTooLong", "4m", "26h", {
        'haproxy_server_status{job="front_door",host="spark-1",proxy="engines",server="spark-2",state="MAINT"}':
            "1x400",
        'haproxy_server_status{job="front_door",host="spark-1",proxy="engines",server="spark-3",state="MAINT"}':
            "0x300 1x100"},
        _alert("HostDrainedTooLong", "spark-2: drained at the front door on spark-1 for over 86400s",
               job="front_door", host="spark-2", front_door="spark-1", proxy="engines", server="spark-2",
               state="MAINT")),
]


def test_every_alert_has_a_case():
    assert {c["alert_rule_test"][0]["alertname"] for c in CASES} == {
        r["alert"] for r in monitoring.rules(parse_settings("spark-1", host_data()))}


@pytest.mark.prometheus
def test_promtool_fires_each_alert_for_its_host_and_keeps_the_others_quiet(tmp_path):
    (tmp_path / "alerts.yml").write_text(monitoring.rules_file(parse_settings("spark-1", host_data())))
    (tmp_path / "tests.yml").write_text(yaml.safe_dump({"rule_files": ["alerts.yml"], "tests": CASES}))
    done = subprocess.run(["promtool", "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_plan_never_prints_the_webhook_url(tmp_path, capsys):
    from sparkfleet import cli

    url = "https://hooks.example/T0KEN-abcdef0123"
    path = tmp_path / "office.py"
    path.write_text(f"_d = {{'api_host': '0.0.0.0', 'api_key': {KEY!r}, 'alertmanager_webhook_url': {url!r}, "
                    "'backend_key_in_clear': True}\n"
                    "sparks = [(f'spark-{n}', {**_d, 'ssh_hostname': f'10.0.0.{n}'}) for n in (1, 2)]\n"
                    "monitoring = sparks[:1]\n")
    for extra in ([], ["--json"]):
        assert cli.main(["plan", str(path), "--offline", *extra]) == 0
        out = capsys.readouterr()
        assert "T0KEN" not in out.out + out.err
    assert "T0KEN" in monitoring.monitoring_plan("spark-1", plans(alertmanager_webhook_url=url), GROUPS)\
        .alertmanager_config()


def test_every_unit_listens_on_loopback_only():
    wanted = monitoring.monitoring_plan("spark-1", plans(monitoring_port=9191, monitoring_retention="2w"), GROUPS)
    unit = wanted.unit()
    assert " --web.listen-address=127.0.0.1:9191" in unit and " --storage.tsdb.retention.time=2w " in unit
    start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert start.endswith(f" --web.console.libraries={m.PROMETHEUS_CONSOLE_LIBRARIES}")  # the status page's flags last
    assert "\nExecReload=" in unit
    assert "--web.listen-address=127.0.0.1:9100 " in monitoring.node_exporter_unit()
    manager = wanted.alertmanager_unit()
    assert "--web.listen-address=127.0.0.1:9093 --cluster.listen-address=\n" in manager
    with pytest.raises(SettingsError, match="monitoring_port"):
        monitoring.monitoring_plan("spark-1", plans(monitoring_port=8080), GROUPS)
