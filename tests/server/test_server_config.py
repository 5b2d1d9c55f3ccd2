"""Configuration: flags and PCGTTS_* variables, `pcgtts serve` as a real process, API key, overload (429)."""

from __future__ import annotations

import argparse
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import openai
import pytest
from pcgtts.server.settings import ServerSettings, add_arguments, settings_from
from pcgtts.tts import TTSConfig, TTSService
from server_support import LiveServer, free_port, serve_process
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect


def test_flags_override_environment_override_defaults():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    env = {"PCGTTS_PORT": "9001", "PCGTTS_ACCEPTANCE": "exact", "PCGTTS_MAX_UPLOAD_MB": "2.5",
           "PCGTTS_API_KEY": "from-env"}
    settings = settings_from(parser.parse_args(["--port", "9002", "--num-speculative-tokens", "5"]), env)
    assert settings.port == 9002 and settings.num_speculative_tokens == 5  # flags win
    assert settings.acceptance == "exact" and settings.max_upload_mb == 2.5 and settings.api_key == "from-env"
    assert settings.host == ServerSettings().host and settings.model is None  # defaults: embedded model


def test_shared_voices_is_a_flag():
    """Off by default; 1 / true / yes / on and 0 / false / no / off from the environment or the command line;
    anything else is an error, not a silent truthy string."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert ServerSettings().shared_voices is False
    for text, value in (("1", True), ("true", True), ("Yes", True), ("on", True), ("0", False),
                        ("off", False)):
        assert settings_from(None, {"PCGTTS_SHARED_VOICES": text}).shared_voices is value
    assert settings_from(parser.parse_args(["--shared-voices", "1"]), {}).shared_voices is True
    with pytest.raises(ValueError, match="expected 1 or 0"):
        settings_from(None, {"PCGTTS_SHARED_VOICES": "2"})
    with pytest.raises(SystemExit):
        parser.parse_args(["--shared-voices", "maybe"])


def test_serve_help_documents_every_option():
    out = subprocess.run([sys.executable, "-m", "pcgtts.cli", "serve", "--help"], capture_output=True,
                         text=True, check=True).stdout
    for flag, env in (("--model", "PCGTTS_MODEL"), ("--port", "PCGTTS_PORT"),
                      ("--acceptance", "PCGTTS_ACCEPTANCE"),
                      ("--num-speculative-tokens", "PCGTTS_NUM_SPECULATIVE_TOKENS"),
                      ("--asg-table", "PCGTTS_ASG_TABLE"), ("--kv-budget-tokens", "PCGTTS_KV_BUDGET_TOKENS"),
                      ("--api-key", "PCGTTS_API_KEY"), ("--data-dir", "PCGTTS_DATA_DIR")):
        assert flag in out and env in out, flag


def test_pcgtts_serve_process_from_environment(demo_bundle, tmp_path):
    env = {"PCGTTS_MODEL": str(demo_bundle), "PCGTTS_DATA_DIR": str(tmp_path), "PCGTTS_LOG_LEVEL": "warning"}
    with serve_process(env, ready_timeout=180) as url:  # the port comes as a flag, the rest from PCGTTS_*
        assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == demo_bundle.name
        body = {"model": "tts-1", "voice": "alloy", "input": "Hello.", "response_format": "wav"}
        assert httpx.post(url + "/v1/audio/speech", json=body, timeout=120).content[:4] == b"RIFF"
    assert (tmp_path / "voices" / "voices.sqlite3").exists()


def test_one_line_says_when_the_server_speaks_and_names_the_url_to_open(demo_bundle, tmp_path):
    """uvicorn's "running on" comes while the model may still load (a POST then gets 503); the ready line
    comes once the model is loaded and the socket listens, with the URL of PCGTTS_PORT: at that moment a
    speech request succeeds."""
    port = free_port()
    env = {**os.environ, "PCGTTS_MODEL": str(demo_bundle), "PCGTTS_PORT": str(port),
           "PCGTTS_DATA_DIR": str(tmp_path), "PCGTTS_LOG_LEVEL": "info"}
    process = subprocess.Popen([sys.executable, "-m", "pcgtts.cli", "serve"], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 180
        while not any("ready: open" in line for line in seen):
            assert time.monotonic() < deadline and process.poll() is None, "".join(seen)
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                pass
        url = f"http://127.0.0.1:{port}"
        body = {"input": "Ready now.", "response_format": "pcm", "max_tokens": 20}
        spoken = httpx.post(url + "/v1/audio/speech", json=body, timeout=120)  # at once: no retry
        assert spoken.status_code == 200 and len(spoken.content) > 0, spoken.text
        assert httpx.get(url + "/ready").status_code == 200
    finally:
        process.terminate()
        process.wait(timeout=60)
    ready = next(line for line in seen if "ready: open" in line)
    assert f"ready: open {url}/ for the playground, {url}/docs for the API" in ready
    assert any("Uvicorn running on" in line for line in seen[:seen.index(ready)])
    from pcgtts.server.cli import browser_url  # a wildcard host is opened as this machine

    assert browser_url("0.0.0.0", 9000) == "http://127.0.0.1:9000/"
    assert browser_url("::", 9000) == "http://[::1]:9000/" and browser_url("fe80::1", 80) == "http://[fe80::1]:80/"


@pytest.fixture(scope="module")
def guarded_server(demo_bundle, tmp_path_factory):
    """API key required; a waiting queue of 0 so that every synthesis is refused as overload."""
    service = TTSService.load(TTSConfig(model_dir=demo_bundle, max_waiting=0))
    settings = ServerSettings(model=str(demo_bundle), port=free_port(), api_key="sekret",
                              data_dir=str(tmp_path_factory.mktemp("guarded")))
    live = LiveServer(settings, service).start()
    yield live
    live.stop()
    service.close()


def test_api_key_is_required_on_the_api(guarded_server):
    url = guarded_server.url
    wrong = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        wrong.models.list()
    assert info.value.code == "invalid_api_key"
    right = openai.OpenAI(base_url=url + "/v1", api_key="sekret", max_retries=0)
    assert right.models.list().data[0].id
    for open_path in ("/health", "/ready", "/metrics", "/"):  # probes, scrapes and the page stay open
        assert httpx.get(url + open_path).status_code == 200, open_path
    ws_url = url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    with pytest.raises(InvalidStatus):
        connect(ws_url)
    with connect(ws_url + "?api_key=sekret") as ws:
        assert '"session.created"' in ws.recv(timeout=10)


def test_overload_is_rate_limit_error(guarded_server):
    client = openai.OpenAI(base_url=guarded_server.url + "/v1", api_key="sekret", max_retries=0)
    with pytest.raises(openai.RateLimitError) as info:
        client.audio.speech.create(model="tts-1", voice="alloy", input="Hello.")
    assert info.value.code == "rate_limit_exceeded"
    assert info.value.response.headers["retry-after"] == "1"


def test_refusals_are_counted_apart_from_errors(guarded_server):
    """/metrics: a 429 (the server at capacity) is status="refused", not "error", so an operator tells
    overload from faults."""
    from prometheus_client.parser import text_string_to_metric_families

    def requests_by_status() -> dict[str, float]:
        text = httpx.get(guarded_server.url + "/metrics").text
        family = next(f for f in text_string_to_metric_families(text) if f.name == "pcgtts:requests")
        out: dict[str, float] = {}
        for sample in family.samples:
            if sample.name.endswith("_total"):
                out[sample.labels["status"]] = out.get(sample.labels["status"], 0) + sample.value
        return out

    before = requests_by_status()
    for fmt in ("pcm", "wav"):
        refused = httpx.post(guarded_server.url + "/v1/audio/speech", timeout=60,
                             json={"input": "Hello.", "response_format": fmt},
                             headers={"Authorization": "Bearer sekret"})
        assert refused.status_code == 429
    after = requests_by_status()
    assert after.get("refused", 0) - before.get("refused", 0) == 2
    assert after.get("error", 0) == before.get("error", 0)


def test_model_that_fails_to_load_is_reported(tmp_path):
    """Liveness stays up, readiness and the API say 503 with the reason (no silent failure)."""
    settings = ServerSettings(model=str(tmp_path / "no-such-model"), port=free_port(), data_dir=str(tmp_path))
    server = LiveServer(settings).start(wait_for_model=False)
    try:
        deadline = time.monotonic() + 60
        while server.state.load_error is None:
            assert time.monotonic() < deadline, "loading never failed"
            time.sleep(0.05)
        assert httpx.get(server.url + "/health").status_code == 200
        ready = httpx.get(server.url + "/ready")
        assert ready.status_code == 503 and ready.json()["status"] == "failed"
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="-", max_retries=0)
        with pytest.raises(openai.InternalServerError) as info:
            client.audio.speech.create(model="tts-1", voice="alloy", input="Hello.")
        assert info.value.status_code == 503 and info.value.code == "model_load_failed"
    finally:
        server.stop()


def test_extra_asg_tables_option_names_tables_by_stem_or_given_name():
    from pcgtts.server.state import tts_config

    settings = ServerSettings(extra_asg_tables="tables/asg-0.45.safetensors, wide=tables/w.safetensors")
    assert settings.extra_asg_table_paths == {"asg-0.45": Path("tables/asg-0.45.safetensors"),
                                              "wide": Path("tables/w.safetensors")}
    assert tts_config(settings).extra_asg_tables == settings.extra_asg_table_paths


def test_initial_codec_chunk_frames_sets_the_first_block(demo_bundle):
    from pcgtts.server.state import tts_config

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    settings = settings_from(parser.parse_args(["--initial-codec-chunk-frames", "4"]), {})
    service = TTSService.load(replace(tts_config(settings), model_dir=demo_bundle))
    try:
        gl = service.codec.gl
        assert gl.first_block == 4 and gl.bounds(0) == (0, 4) and gl.bounds(1) == (4, 12)  # then doubling
    finally:
        service.close()
    with pytest.raises(ValueError):
        TTSService.load(TTSConfig(model_dir=demo_bundle, initial_codec_chunk_frames=0))
