"""Monitoring as deployed: a real Prometheus scrapes a real server with the shipped config, and every
metric the provisioned Grafana dashboard queries exists and evaluates."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from server_support import free_port
from system_support import require_program

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
METRIC = re.compile(r"pcgtts:[a-z_]+")


def load_dashboard_builder():
    path = DEPLOY / "grafana" / "build_dashboard.py"
    spec = importlib.util.spec_from_file_location("build_dashboard", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dashboard_exprs() -> list[str]:
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "pcgtts.json").read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


def test_committed_dashboard_matches_its_builder():
    committed = json.loads((DEPLOY / "grafana" / "dashboards" / "pcgtts.json").read_text())
    assert committed == load_dashboard_builder().dashboard()
    # provisioned dashboards must name the provisioned datasource uid, never ${DS_PROMETHEUS}
    uid = re.search(r"uid: (\w+)", (DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    assert {p["datasource"]["uid"] for p in committed["panels"]} == {uid.group(1)}
    assert "${DS_" not in json.dumps(committed)


def synthesize_once(url: str) -> None:
    names = httpx.get(f"{url}/v1/audio/voices", timeout=30).json()["voices"]
    body = {"model": "pcgtts", "input": "Hello there.", "response_format": "pcm", "max_tokens": 40,
            "seed": 1, **({"voice": names[0]} if names else {})}
    response = httpx.post(f"{url}/v1/audio/speech", json=body, timeout=300)
    assert response.status_code == 200, response.text
    assert len(response.content) > 0


def test_dashboard_metrics_are_exported(live_server):
    synthesize_once(live_server.url)
    exposition = httpx.get(f"{live_server.url}/metrics", timeout=30).text
    exported = set(re.findall(r"^(pcgtts:[a-z_]+)", exposition, flags=re.M))
    wanted = {name for expr in dashboard_exprs() for name in METRIC.findall(expr)}
    assert wanted, "the dashboard queries no pcgtts metric"
    assert wanted <= exported, f"dashboard queries metrics the server does not export: {wanted - exported}"


@pytest.fixture
def prometheus(live_server, tmp_path):
    binary = require_program("prometheus")
    shipped = (DEPLOY / "prometheus" / "prometheus.yml").read_text()
    assert "pcgtts:8000" in shipped
    # The shipped config with the compose service name swapped for the test server, scraped every second.
    config = shipped.replace("pcgtts:8000", f"127.0.0.1:{live_server.port}").replace(
        "scrape_interval: 5s", "scrape_interval: 1s")
    (tmp_path / "prometheus.yml").write_text(config)
    port = free_port()
    process = subprocess.Popen(
        [binary, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"))
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(timeout=30)


def query(prom: str, expr: str) -> list:
    response = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=10)
    if response.status_code == 503:  # "Service Unavailable" while Prometheus starts: wait_for retries
        response.raise_for_status()
    payload = response.json()
    assert payload["status"] == "success", payload
    return payload["data"]["result"]


def wait_for(predicate, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = predicate()
            if result:
                return result
        except (httpx.HTTPError, KeyError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for Prometheus")
        time.sleep(1.0)


def test_real_prometheus_scrapes_the_server(live_server, prometheus):
    wait_for(lambda: [r for r in query(prometheus, 'up{job="pcgtts"}') if r["value"][1] == "1"])
    synthesize_once(live_server.url)
    tokens = wait_for(lambda: query(prometheus, "pcgtts:generation_tokens_total > 0"))
    assert float(tokens[0]["value"][1]) > 0
    wait_for(lambda: query(prometheus, "pcgtts:audio_time_to_first_chunk_seconds_count > 0"))
    # Every dashboard expression is valid PromQL over the scraped series (Grafana would show it).
    builder = load_dashboard_builder()
    for expr in dashboard_exprs():
        query(prometheus, expr.replace(builder.RATE, "[1m]"))
