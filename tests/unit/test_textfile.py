"""files/sparkfleet-textfile: the GB10's and the watchdog's state as the node exporter's textfile collector reads it.
nvidia-smi's answer is data: [N/A] and [Not Supported] fields are left out, a failure or a strange answer is
reading_ok 0, and nothing it prints becomes a line or a label of its own."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys

import pytest

from sparkfleet import FILES_DIR
from sparkfleet.contract import monitoring as m

SCRIPT = FILES_DIR / "sparkfleet-textfile"
T = runpy.run_path(str(SCRIPT))
FIELDS = ", ".join(["850", "3003", "[N/A]", "61"] + ["Not Active", "Not Active", "Active"] + ["[Not Supported]"] * 5)


def test_names_and_files_are_the_contracts():
    assert T["REASONS"] == m.THROTTLE_REASONS
    assert {name for _, name, _ in T["GAUGES"]} | {"sparkfleet_gpu_reading_ok", "sparkfleet_gpu_throttle_active"} \
        == set(m.GPU_METRICS)
    assert (m.GPU_TEXTFILE, m.WATCHDOG_TEXTFILE) == (f"{m.TEXTFILE_DIR}/gpu.prom", f"{m.TEXTFILE_DIR}/watchdog.prom")


def test_a_reading_with_unsupported_fields_keeps_what_it_has():
    lines = T["gpu_lines"](FIELDS + "\n")
    assert "sparkfleet_gpu_reading_ok 1" in lines and "sparkfleet_gpu_sm_clock_mhz 850" in lines
    assert "sparkfleet_gpu_temperature_celsius 61" in lines
    assert not any(line.startswith("sparkfleet_gpu_power_draw_watts") for line in lines)
    assert 'sparkfleet_gpu_throttle_active{reason="sw_power_cap"} 1' in lines
    assert 'sparkfleet_gpu_throttle_active{reason="gpu_idle"} 0' in lines
    assert not any('reason="hw_slowdown"' in line for line in lines)


@pytest.mark.parametrize("answer", [None, "", "[N/A], 3003, 4, 38" + ", Active" * 8,
                                    "850, 3003\n", FIELDS.replace("850", "1e400"),
                                    FIELDS + ", extra", "Failed to initialize NVML: Unknown Error"])
def test_a_failed_or_strange_reading_is_reading_ok_0(answer):
    lines = T["gpu_lines"](answer)
    assert lines[-1] == "sparkfleet_gpu_reading_ok 0" and not any("clock_mhz" in line for line in lines)


def test_a_hostile_field_never_becomes_a_line_or_a_label():
    fields = FIELDS.split(", ")
    fields[6] = 'Active"} 1 sparkfleet_gpu_throttle_active{reason="x'
    lines = T["gpu_lines"](", ".join(fields))
    assert "sparkfleet_gpu_reading_ok 1" in lines and not any('reason="x' in line for line in lines)
    assert not any('reason="sw_power_cap"' in line for line in lines)
    split = T["gpu_lines"](FIELDS.replace("Active", 'Active"} 1\nsparkfleet_x{a="', 1))
    assert split[-1] == "sparkfleet_gpu_reading_ok 0" and not any("sparkfleet_x" in line for line in split)


def test_the_watchdog_state_and_a_missing_one(tmp_path):
    state = tmp_path / "watchdog.json"
    serving = tmp_path / "serving.json"
    serving.write_text(json.dumps({"unit": 'sparkfleet-vllm.service"x', "state_file": str(state)}))
    assert T["watchdog_lines"](str(serving)) == []
    state.write_text(json.dumps({"gave_up": True, "restarts_total": 3, "last_result": "health"}))
    lines = T["watchdog_lines"](str(serving))
    assert 'sparkfleet_watchdog_gave_up{unit="sparkfleet-vllm.service\\"x"} 1' in lines
    assert 'sparkfleet_watchdog_restarts_total{unit="sparkfleet-vllm.service\\"x"} 3' in lines
    assert 'sparkfleet_watchdog_probe_ok{unit="sparkfleet-vllm.service\\"x"} 0' in lines
    assert T["watchdog_lines"](str(tmp_path / "none.json")) == []


def run_script(tmp_path, answer: str = f"echo '{FIELDS}'"):
    """The script with a stand-in nvidia-smi (its shell body `answer`) first on PATH: its --out directory."""
    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    bin_dir.mkdir(exist_ok=True)
    out.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{answer}\n")
    smi.chmod(0o755)
    state, serving = tmp_path / "watchdog.json", tmp_path / "serving.json"
    state.write_text(json.dumps({"gave_up": False, "restarts_total": 1, "last_result": "ok"}))
    serving.write_text(json.dumps({"unit": "sparkfleet-vllm.service", "state_file": str(state)}))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    subprocess.run([sys.executable, str(SCRIPT), "--serving", str(serving), "--out", str(out)], env=env, check=True,
                   timeout=30)
    return out


def test_the_script_writes_both_files_with_a_stand_in_nvidia_smi(tmp_path):
    out = run_script(tmp_path)
    assert sorted(p.name for p in out.iterdir()) == ["gpu.prom", "watchdog.prom"]
    assert "sparkfleet_gpu_sm_clock_max_mhz 3003\n" in (out / "gpu.prom").read_text()
    assert 'sparkfleet_watchdog_probe_ok{unit="sparkfleet-vllm.service"} 1\n' in (out / "watchdog.prom").read_text()
    run_script(tmp_path, "echo 'NVIDIA-SMI has failed'; exit 9")
    assert (out / "gpu.prom").read_text().endswith("sparkfleet_gpu_reading_ok 0\n")


@pytest.mark.prometheus
def test_both_files_pass_promtool(tmp_path):
    out = run_script(tmp_path)
    for name in ("gpu.prom", "watchdog.prom"):
        lint = subprocess.run(["promtool", "check", "metrics"], input=(out / name).read_text(), text=True,
                              capture_output=True, timeout=30)
        assert "error" not in (lint.stdout + lint.stderr).lower(), lint.stdout + lint.stderr


@pytest.mark.parametrize("knobs, throttling, clock", [
    ({}, set(), "2418"), ({"throttle": "power", "sm_clock_mhz": 850}, {"sw_power_cap"}, "850"),
    ({"throttle": "thermal"}, {"hw_thermal_slowdown", "sw_thermal_slowdown"}, "2418")])
def test_the_sims_nvidia_smi_answers_the_query_as_set_gpu_sets_it(tmp_path, knobs, throttling, clock):
    """The stand-in (sim/images/spark) knows every field the textfile asks, and its throttle knob lands on the
    reasons the alert reads; the fields a GB10 reads as [N/A] are left out."""
    stand_in = (FILES_DIR.parent / "sim/images/spark/rootfs/usr/bin/nvidia-smi").read_text()
    (tmp_path / "gpu.json").write_text(json.dumps(knobs))
    script = tmp_path / "nvidia-smi"
    script.write_text(stand_in.replace('"/etc/sparkfleet-sim/gpu.json"', repr(str(tmp_path / "gpu.json"))))
    done = subprocess.run([sys.executable, str(script), f"--query-gpu={','.join(T['FIELDS'])}",
                           "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stdout
    lines = T["gpu_lines"](done.stdout)
    assert "sparkfleet_gpu_reading_ok 1" in lines and f"sparkfleet_gpu_sm_clock_mhz {clock}" in lines
    active = {line.split('"')[1] for line in lines if line.startswith("sparkfleet_gpu_throttle_active{")
              and line.endswith(" 1")}
    assert active == throttling
    assert not any('reason="sync_boost"' in line for line in lines)
