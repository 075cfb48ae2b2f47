"""The speed gate's rule, its figures, the host's speed record and the SSH forward: no hosts."""

import json

import pytest

from sparkfleet.contract.speed import Figures, parse_record, render_record
from sparkfleet.fleet.speed import (
    NOISE_DECODE_TOKENS_PER_S,
    NOISE_TTFT_MS,
    SpeedCheck,
    SpeedError,
    figures_of,
    forward_command,
    regression,
)

BEFORE = Figures(50.0, 120.0)


@pytest.mark.parametrize("decode, ttft, worse", [
    (50.0, 120.0, []),
    (46.0, 125.0, []),  # -8 %: within 10 %
    (44.0, 120.0, ["decode"]),  # -12 %
    (30.0, 120.0, ["decode"]),  # -40 %
    (50.0, 180.0, ["TTFT"]),  # +50 %, +60 ms
    (30.0, 200.0, ["decode", "TTFT"]),
    (60.0, 60.0, []),  # faster is never a regression
])
def test_decode_down_or_ttft_up_by_more_than_the_share_is_a_regression(decode, ttft, worse):
    found = regression(Figures(decode, ttft), BEFORE, 0.10)
    assert [phrase.split()[0] for phrase in found] == worse


def test_the_noise_floor_keeps_small_absolute_changes_from_failing_a_rollout():
    slow_engine = Figures(5.0, 2000.0)  # a small model's decode, a long prompt's TTFT
    just_under = Figures(5.0 - NOISE_DECODE_TOKENS_PER_S + 0.01, 2000.0)  # -20 %, but under 1 tok/s
    assert regression(just_under, slow_engine, 0.10) == []
    quick = Figures(50.0, 20.0)  # +100 % of 20 ms, under the 50 ms floor
    assert regression(Figures(50.0, 20.0 + NOISE_TTFT_MS - 1), quick, 0.10) == []
    assert regression(Figures(50.0, 20.0 + NOISE_TTFT_MS + 1), quick, 0.10) != []


def test_the_share_is_the_setting():
    assert regression(Figures(44.0, 120.0), BEFORE, 0.10) != []
    assert regression(Figures(44.0, 120.0), BEFORE, 0.15) == []


def test_the_halt_line_names_both_rates_and_the_setting():
    check = SpeedCheck("spark-1", "new1", "old1", measured=Figures(30.1, 121.0), baseline=Figures(50.2, 119.0))
    check.judge(0.10)
    assert check.verdict == "regressed"
    assert check.line == "spark-1: decode 30.1 tok/s vs 50.2 before (-40 %), over rollout_max_regression 10 %"
    check = SpeedCheck("spark-1", "new1", "old1", measured=Figures(49.0, 121.0), baseline=Figures(50.2, 119.0),
                       baseline_measured_now=True)
    check.judge(0.10)
    assert check.verdict == "passed" and check.line.endswith("within rollout_max_regression 10 % or the noise "
                                                             "floor (1 tok/s, 50 ms) (baseline measured now)")
    assert "decode 49.0 tok/s vs 50.2 before (-2 %), TTFT 121 ms vs 119 before (+2 %)" in check.line
    assert check.to_dict()["baseline"] == {"decode_tokens_per_s": 50.2, "ttft_ms": 119.0, "release": "old1",
                                           "source": "measured now"}


def test_without_a_previous_figure_the_measurement_is_the_baseline():
    check = SpeedCheck("spark-1", "new1", None, measured=Figures(30.0, 120.0))
    check.judge(0.10)
    assert check.verdict == "baseline" and "no previous figure, this measurement is the baseline" in check.line
    assert check.to_dict()["baseline"] is None


def bench_result(decodes, ttfts, errors=0):
    """run_bench's shape, as much of it as the gate reads."""
    level = {"concurrency": 1, "ttft_ms": {"p50": sorted(ttfts)[len(ttfts) // 2]}, "error_messages": []}
    return {"errors": errors, "levels": [level, {"concurrency": 4, "ttft_ms": {"p50": 999.0}, "error_messages":
                                                 ["APIConnectionError: refused"] if errors else []}],
            "single_stream_decode_tokens_per_s": sorted(decodes)[len(decodes) // 2]}


def test_the_kept_figures_are_single_stream_decode_and_ttft_at_concurrency_one():
    found = figures_of(bench_result([49.0, 50.0, 51.0], [100.0, 110.0, 300.0]))
    assert (found.decode_tokens_per_s, found.ttft_ms) == (50.0, 110.0) and found.measured_at


def test_a_run_with_errors_or_without_figures_is_no_measurement():
    with pytest.raises(SpeedError, match="1 requests failed: APIConnectionError: refused"):
        figures_of(bench_result([50.0], [100.0], errors=1))
    with pytest.raises(SpeedError, match="no single-stream decode rate"):
        figures_of({**bench_result([50.0], [100.0]), "single_stream_decode_tokens_per_s": None})


def test_the_record_keeps_figures_by_release_the_newest_last():
    text = render_record({}, {"aaaaaa111111": Figures(50.0, 120.0, "t1")})
    kept = parse_record(json.loads(text))
    assert kept == {"aaaaaa111111": Figures(50.0, 120.0, "t1")}
    text = render_record(kept, {"bbbbbb222222": Figures(30.0, 121.0, "t2")})
    assert list(json.loads(text)["releases"]) == ["aaaaaa111111", "bbbbbb222222"]
    many = {f"{n:012x}": Figures(50.0, 100.0) for n in range(10)}
    assert list(parse_record(json.loads(render_record(many, {"cccccc333333": Figures(1.0, 1.0)}, keep=3)))) == [
        f"{8:012x}", f"{9:012x}", "cccccc333333"]
    with pytest.raises(ValueError, match="not a release id"):
        render_record({}, {"../etc": Figures(1.0, 1.0)})


@pytest.mark.parametrize("record", [None, [], "x", {"releases": []}, {"releases": {"aaaaaa111111": "fast"}}])
def test_a_record_not_of_the_format_counts_for_nothing(record):
    assert parse_record(record) == {}


def test_an_entry_read_back_is_checked_not_trusted():
    record = {"releases": {
        "aaaaaa111111": {"decode_tokens_per_s": 50, "ttft_ms": 120.5, "measured_at": "2026-01-01T00:00:00+00:00"},
        "bbbbbb222222": {"decode_tokens_per_s": True, "ttft_ms": 120},  # a bool is no figure
        "cccccc333333": {"decode_tokens_per_s": -1, "ttft_ms": 120},
        "dddddd444444": {"decode_tokens_per_s": float("nan"), "ttft_ms": 120},
        "not a release; rm -rf /": {"decode_tokens_per_s": 50, "ttft_ms": 120},
        "eeeeee555555": {"decode_tokens_per_s": 50, "ttft_ms": 120, "measured_at": "\x1b[31mred"},
    }}
    assert parse_record(record) == {"aaaaaa111111": Figures(50.0, 120.5, "2026-01-01T00:00:00+00:00"),
                                    "eeeeee555555": Figures(50.0, 120.0, "")}


def test_the_forward_uses_the_inventorys_ssh_settings_and_no_shell():
    data = {"ssh_hostname": "10.0.0.5", "ssh_user": "admin", "ssh_port": 2222, "ssh_key": "/k/id",
            "ssh_known_hosts_file": "/k/known", "ssh_strict_host_key_checking": "yes"}
    command = forward_command("spark-1", data, 40001, 8000)
    assert command[:2] == ["ssh", "-N"] and "ExitOnForwardFailure=yes" in command and "BatchMode=yes" in command
    assert command[command.index("-L") + 1] == "127.0.0.1:40001:127.0.0.1:8000"
    assert command[command.index("-p") + 1] == "2222" and command[command.index("-i") + 1] == "/k/id"
    assert "UserKnownHostsFile=/k/known" in command and "StrictHostKeyChecking=yes" in command
    assert command[command.index("-l") + 1] == "admin" and command[-2:] == ["--", "10.0.0.5"]  # after "--": never an option
    assert forward_command("spark-1", {}, 40001, 8000)[-2:] == ["--", "spark-1"]


class FakeForward:
    """subprocess.Popen for `ssh -N -L`: listens on the forward's local port (loopback), or exits at once."""

    def __init__(self, command, fail: bool = False, **kwargs):
        import io
        import socket

        self.command, self.fail, self.terminated = command, fail, False
        self.stderr = io.BytesIO(b"\x1b]0;a host's banner\x07Welcome\nchannel 0: open failed: administratively "
                                 b"prohibited")
        local = command[command.index("-L") + 1].split(":")
        self.listener = None
        if not fail:
            self.listener = socket.socket()
            self.listener.bind((local[0], int(local[1])))
            self.listener.listen()

    def poll(self):
        return 255 if self.fail else None

    def terminate(self):
        self.terminated = True
        if self.listener:
            self.listener.close()

    def wait(self, timeout=None):
        return 0


def test_an_api_on_loopback_only_is_measured_through_an_ssh_forward(monkeypatch):
    from types import SimpleNamespace

    from sparkfleet.fleet import speed

    started = []
    monkeypatch.setattr(speed.subprocess, "Popen", lambda command, **kw: started.append(FakeForward(command)) or
                        started[-1])
    loopback = SimpleNamespace(controller_api_url=None, api_is_loopback=True, api_port=8000, fleet_ca_cert=None,
                               backend_key_in_clear=False)
    with speed.reach("spark-1", loopback, {"ssh_user": "admin"}) as url:
        assert url.startswith("http://127.0.0.1:")
        assert started[0].command[-5:] == ["admin", "-o", "ConnectTimeout=10", "--", "spark-1"]
        assert started[0].command[started[0].command.index("-L") + 1].endswith(":127.0.0.1:8000")
    assert started[0].terminated  # the forward lasts the measurement only
    lan = SimpleNamespace(controller_api_url="http://10.0.0.5:8000/", api_is_loopback=False, api_port=8000,
                          fleet_ca_cert=None, backend_key_in_clear=False)
    with speed.reach("spark-1", lan, {}) as url:
        assert url == "http://10.0.0.5:8000" and len(started) == 1  # reached as status reaches it: no forward
    # a guard that may answer the fleet's certificates only: the engine itself, through the forward
    tls = SimpleNamespace(**{**vars(lan), "fleet_ca_cert": "/etc/ca.crt"})
    with speed.reach("spark-1", tls, {}) as url:
        assert url.startswith("http://127.0.0.1:") and len(started) == 2
        assert started[1].command[started[1].command.index("-L") + 1].endswith(":127.0.0.1:18000")
    with speed.reach("spark-1", SimpleNamespace(**{**vars(tls), "backend_key_in_clear": True}), {}) as url:
        assert url == "http://10.0.0.5:8000" and len(started) == 2  # plain hops on purpose: as before


def test_a_forward_that_fails_is_a_reach_error_not_the_engines(monkeypatch):
    from types import SimpleNamespace

    from sparkfleet.fleet import speed

    monkeypatch.setattr(speed.subprocess, "Popen", lambda command, **kw: FakeForward(command, fail=True))
    loopback = SimpleNamespace(controller_api_url=None, api_is_loopback=True, api_port=8000, fleet_ca_cert=None,
                               backend_key_in_clear=False)
    with pytest.raises(speed.ReachError) as raised:
        with speed.reach("spark-1", loopback, {}):
            pass
    assert str(raised.value) == ("ssh forward to spark-1 failed: ]0;a host's bannerWelcome / channel 0: open failed: "
                                 "administratively prohibited")  # what the host printed, without its escapes
