"""`status` reads the alerts from Prometheus's /api/v1/alerts (here a loopback server standing in for it): the
firing ones with the host they name; pending ones are not; an answer that is not that API's, too large, an error
or no answer is one clear reason; whatever the host sends is text, cut short, without control characters."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from sparkfleet.fleet import alerts

FIRING = {"status": "success", "data": {"alerts": [
    {"labels": {"alertname": "EngineNotServing", "host": "spark-2", "job": "engine"}, "state": "firing",
     "annotations": {"summary": "spark-2: an engine is down or not serving"}, "value": "0e+00"},
    {"labels": {"alertname": "GpuThrottling", "host": "spark-3"}, "state": "pending", "annotations": {}},
]}}


@pytest.fixture
def prometheus():
    """A loopback HTTP server answering /api/v1/alerts with what the test sets (status, body)."""
    answer = {"status": 200, "body": json.dumps(FIRING).encode()}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = answer["body"] if self.path == "/api/v1/alerts" else b"not found"
            self.send_response(answer["status"] if self.path == "/api/v1/alerts" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", answer
    server.shutdown()


def test_firing_alerts_name_their_host_and_pending_ones_do_not_count(prometheus):
    url, _ = prometheus
    assert alerts.read_alerts(url) == [{"alert": "EngineNotServing", "host": "spark-2",
                                        "summary": "spark-2: an engine is down or not serving"}]


def test_no_alert_firing_is_an_empty_list(prometheus):
    url, answer = prometheus
    answer["body"] = b'{"status": "success", "data": {"alerts": []}}'
    assert alerts.read_alerts(url) == []


@pytest.mark.parametrize("status, body, reason", [
    (200, b"<html>a login page</html>", "not the alerts API's"),
    (200, b'{"status": "error", "error": "x"}', "not the alerts API's"),
    (200, b'{"status": "success", "data": {"alerts": "many"}}', "not the alerts API's"),
    (200, b"[1, 2]", "not the alerts API's"),
    (503, b"Service Unavailable", "HTTP 503"),
    (200, b" " * (alerts.MAX_ANSWER_BYTES + 1), "more than"),
])
def test_an_answer_that_is_not_the_apis_is_one_reason(prometheus, status, body, reason):
    url, answer = prometheus
    answer.update(status=status, body=body)
    with pytest.raises(alerts.AlertsUnavailable, match=reason):
        alerts.read_alerts(url)


def test_no_answer_is_one_reason():
    with pytest.raises(alerts.AlertsUnavailable, match="did not answer"):
        alerts.read_alerts("http://127.0.0.1:9")


def test_hostile_labels_are_plain_short_text():
    body = json.dumps({"status": "success", "data": {"alerts": [
        {"labels": {"alertname": "X\x1b[2J\nEvil", "host": ["spark-1"]}, "state": "firing",
         "annotations": {"summary": "s" * 5000}},
        "not an alert", {"state": "firing", "labels": "nope"}]}}).encode()
    found = alerts.firing(body)
    assert found[0] == {"alert": "?", "host": "?", "summary": ""}
    assert found[1]["alert"] == "X[2JEvil" and found[1]["host"] == "?"
    assert len(found[1]["summary"]) == alerts.MAX_CHARS


def test_alerts_ok_only_without_firing_alerts_and_silent_prometheus():
    assert alerts.alerts_ok(None) and alerts.alerts_ok({"firing": [], "problems": []})
    assert not alerts.alerts_ok({"firing": [{"alert": "A", "host": "h", "summary": ""}], "problems": []})
    assert not alerts.alerts_ok({"firing": [], "problems": ["monitoring on spark-1: ..."]})


def test_an_inventory_without_a_monitoring_group_reads_no_alerts(tmp_path):
    path = tmp_path / "office.py"
    path.write_text("sparks = [('spark-1', {'ssh_hostname': '10.0.0.1'})]\n")
    assert alerts.fleet_alerts(str(path)) is None
