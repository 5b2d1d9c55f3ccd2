"""The log of a real `pcgtts serve` at --log-level debug: no secret in any line, whichever way the key
arrived (every logger: ours, uvicorn's, its access log, the websockets library's handshake lines), and a
refused WebSocket is one access line, not an ERROR."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from urllib.parse import quote, quote_plus

import httpx
import pytest
from server_support import free_port, wait_ready
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

KEY = "pcg-Secret+Key/42~x"  # '+' and '/': its base64, base64url and percent-encoded forms all differ


def encodings(key: str) -> set[str]:
    """Every form the key travels in, as a client writes it."""
    raw = key.encode()
    forms = {key, quote(key, safe=""), quote_plus(key)}
    for encoded in (base64.urlsafe_b64encode(raw).decode(), base64.b64encode(raw).decode()):
        forms |= {encoded, encoded.rstrip("=")}
    return forms


@pytest.fixture(scope="module")
def debug_server(demo_bundle, tmp_path_factory):
    """`pcgtts serve --log-level debug --api-key KEY`, its stderr and stdout in one file."""
    folder = tmp_path_factory.mktemp("debug-log")
    port = free_port()
    log = folder / "serve.log"
    env = {**os.environ, "PCGTTS_MODEL": str(demo_bundle), "PCGTTS_DATA_DIR": str(folder)}
    process = subprocess.Popen([sys.executable, "-m", "pcgtts.cli", "serve", "--port", str(port),
                                "--log-level", "debug", "--api-key", KEY], env=env,
                               stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, process, log)
    yield url, log
    process.terminate()
    process.wait(timeout=60)


def ws_url(url: str, query: str = "") -> str:
    return url.replace("http://", "ws://") + "/v1/audio/speech/stream" + query


def session(url: str, **kwargs) -> None:
    """One WebSocket session that must be accepted: created, one message carrying the key as text, closed."""
    with connect(url, **kwargs) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
        ws.send(json.dumps({"type": "input.text", "text": KEY}))  # a key pasted where text goes
        ws.send(json.dumps({"type": "input.cancel"}))


def test_a_debug_log_holds_the_key_in_no_form(debug_server):
    url, log = debug_server
    bearer = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(url + "/v1/models", headers=bearer).status_code == 200
    assert httpx.get(url + "/v1/models", params={"api_key": KEY}).status_code == 401  # HTTP wants the header
    repeated = f"/v1/models?api_key={quote(KEY, safe='')}&x={quote(KEY, safe='')}"
    assert httpx.get(url + repeated, headers=bearer).status_code == 200
    assert httpx.get(url + f"/v1/audio/voices/{quote(KEY, safe='')}", headers=bearer).status_code == 404
    assert httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer x{KEY}"}).status_code == 401
    b64url = base64.urlsafe_b64encode(KEY.encode()).decode()
    session(ws_url(url), additional_headers=bearer)
    session(ws_url(url), subprotocols=["pcgtts", "pcgtts.bearer." + b64url.rstrip("=")])  # the playground's
    session(ws_url(url, f"?api_key={quote(KEY, safe='')}&x={quote_plus(KEY)}"))
    with pytest.raises(InvalidStatus):
        connect(ws_url(url), subprotocols=["pcgtts", "pcgtts.bearer." + b64url[:-4]])  # a wrong one
    deadline = time.monotonic() + 10
    while "connection closed" not in log.read_text().splitlines()[-1] and time.monotonic() < deadline:
        time.sleep(0.1)  # the last session's closing lines
    text = log.read_text()
    assert "DEBUG" in text and "sec-websocket-protocol" in text  # the handshake lines were logged
    assert "[REDACTED]" in text and "/v1/audio/voices/" in text
    found = {form for form in encodings(KEY) if form in text}
    assert not found, [line for line in text.splitlines() if any(form in line for form in found)][:5]


def test_a_refused_websocket_is_not_logged_as_an_error(debug_server):
    url, log = debug_server
    before = len(log.read_text().splitlines())
    for kwargs, status in (({}, 401), ({"origin": "https://elsewhere.example",
                                         "additional_headers": {"Authorization": f"Bearer {KEY}"}}, 403)):
        with pytest.raises(InvalidStatus) as info:
            connect(ws_url(url), **kwargs)
        assert info.value.response.status_code == status
    time.sleep(0.5)  # uvicorn writes its line once the app has returned
    lines = log.read_text().splitlines()[before:]
    assert sum('"WebSocket /v1/audio/speech/stream" 40' in line for line in lines) == 2, lines
    assert not [line for line in lines if "ERROR" in line or "without completing handshake" in line]
