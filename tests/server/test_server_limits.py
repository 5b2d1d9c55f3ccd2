"""Limits and access: body sizes counted as the bytes arrive (chunked JSON and multipart), WebSocket
authentication at the handshake without the key in the URL, foreign origins refused, keys out of logs."""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import threading
import time

import httpx
import pytest
from pcgtts.server.security import SecretRedactor, keys_equal
from pcgtts.server.settings import ServerSettings
from server_support import LiveServer, free_port
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

KEY = "sekret-Key_1"
ALLOWED = "https://allowed.example"
CHUNK = 64 << 10


@pytest.fixture(scope="module")
def guarded(demo_bundle, tts_service, tmp_path_factory):
    settings = ServerSettings(model=str(demo_bundle), port=free_port(), api_key=KEY, max_upload_mb=1.0,
                              cors_origins=ALLOWED, data_dir=str(tmp_path_factory.mktemp("limits")))
    server = LiveServer(settings, tts_service).start()
    yield server
    server.stop()


def body_limit(server) -> int:
    return server.settings.max_upload_bytes * 4 // 3 + (1 << 20)


def rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def send_chunked(port: int, head: str, first: bytes, filler: bytes, total: int) -> tuple[int, bytes]:
    """POST a chunked body of up to `total` bytes (`first`, then `filler` repeated), stopping when the server
    answers, stops reading (send blocks for 2 s) or closes. Returns (body bytes sent, response)."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(2.0)
    sent, response = 0, b""
    try:
        sock.sendall(head.encode())
        piece = first
        while sent < total:
            try:
                sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            except (TimeoutError, BrokenPipeError, ConnectionResetError):
                break
            sent += len(piece)
            piece = filler
            sock.setblocking(False)
            try:
                response = sock.recv(65536)
            except BlockingIOError:
                pass
            sock.settimeout(2.0)
            if response:
                break
        deadline = time.monotonic() + 10
        while b"\r\n\r\n" not in response and time.monotonic() < deadline:
            try:
                data = sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not data:
                break
            response += data
    finally:
        sock.close()
    return sent, response


def peak_rss_during(fn):
    peak, done = [rss_bytes()], threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], rss_bytes())
            time.sleep(0.01)

    before = rss_bytes()
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = fn()
    finally:
        done.set()
        watcher.join()
    return result, peak[0] - before


def test_chunked_json_is_stopped_at_the_limit(guarded):
    limit = body_limit(guarded)
    head = (f"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    total = 200 << 20
    (sent, response), grew = peak_rss_during(
        lambda: send_chunked(guarded.port, head, b'{"input": "Hi.", "ref_text": "', b"a" * CHUNK, total))
    assert response.startswith(b"HTTP/1.1 413"), response[:200]
    assert b"request_too_large" in response
    assert sent < limit + (8 << 20), (sent, limit)  # the limit plus what the socket buffers hold
    assert grew < 64 << 20, grew


def test_chunked_multipart_upload_is_stopped_at_the_limit(guarded):
    limit = body_limit(guarded)
    boundary = "pcgttsboundary"
    head = (f"POST /v1/audio/voices HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: multipart/form-data; boundary={boundary}\r\nTransfer-Encoding: chunked\r\n\r\n")
    first = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"name\"\r\n\r\nbig\r\n"
             f"--{boundary}\r\nContent-Disposition: form-data; name=\"audio_sample\"; filename=\"a.wav\"\r\n"
             "Content-Type: audio/wav\r\n\r\n").encode()
    (sent, response), grew = peak_rss_during(
        lambda: send_chunked(guarded.port, head, first, b"\0" * CHUNK, 400 << 20))
    assert response.startswith(b"HTTP/1.1 413") and b"request_too_large" in response, response[:300]
    assert sent < limit + (8 << 20), (sent, limit)
    assert grew < 64 << 20, grew


def test_declared_length_over_the_limit_is_refused_before_reading(guarded):
    response = httpx.post(guarded.url + "/v1/audio/speech", content=b"x" * (body_limit(guarded) + 1),
                          headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"


def ws_url(server, query: str = "") -> str:
    return server.url.replace("http://", "ws://") + "/v1/audio/speech/stream" + query


def bearer_protocol(key: str) -> str:
    return "pcgtts.bearer." + base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


def handshake_status(url: str, **kw) -> int:
    try:
        with connect(url, open_timeout=10, **kw) as ws:
            assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
            return 101
    except InvalidStatus as exc:
        return exc.response.status_code


def test_websocket_authenticates_at_the_handshake(guarded):
    assert handshake_status(ws_url(guarded)) == 401
    assert handshake_status(ws_url(guarded, "?api_key=wrong")) == 401
    assert handshake_status(ws_url(guarded), subprotocols=["pcgtts", bearer_protocol("wrong")]) == 401
    assert handshake_status(ws_url(guarded), additional_headers={"Authorization": f"Bearer {KEY}"}) == 101
    assert handshake_status(ws_url(guarded, f"?api_key={KEY}")) == 101  # old form, still accepted
    with connect(ws_url(guarded), subprotocols=["pcgtts", bearer_protocol(KEY)]) as ws:
        assert ws.subprotocol == "pcgtts"  # never the bearer one: the key is not echoed
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"


def test_websocket_from_a_foreign_origin_is_refused(guarded):
    auth = {"Authorization": f"Bearer {KEY}"}
    own = guarded.url  # the playground's own origin
    assert handshake_status(ws_url(guarded), origin=own, additional_headers=auth) == 101
    assert handshake_status(ws_url(guarded), origin=ALLOWED, additional_headers=auth) == 101
    assert handshake_status(ws_url(guarded), origin="https://evil.example", additional_headers=auth) == 403


def test_keys_are_redacted_from_log_lines_and_compared_in_constant_time():
    import base64

    redactor = SecretRedactor()
    redactor.add(KEY)
    path = f"/v1/audio/speech/stream?api_key={KEY}&x={KEY}"
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:5", "GET", path, "1.1", 101), None)
    redactor.scrub(record)
    assert len(record.args) == 5  # uvicorn's access formatter unpacks them
    line = record.getMessage()
    assert KEY not in line and "api_key=[REDACTED]&x=[REDACTED]" in line  # by value, not only by pattern
    header = logging.LogRecord("pcgtts", logging.INFO, __file__, 1, "Authorization: Bearer %s", (KEY,), None)
    redactor.scrub(header)
    assert KEY not in header.getMessage()
    encoded = base64.urlsafe_b64encode(KEY.encode()).decode().rstrip("=")
    offered = f"pcgtts, pcgtts.bearer.{encoded}".encode()
    as_bytes = logging.LogRecord("websockets", logging.DEBUG, __file__, 1, "< %s: %s",
                                 ("sec-websocket-protocol", offered), None)
    redactor.scrub(as_bytes)  # the key's base64url form, inside an argument that is not a str
    assert encoded not in as_bytes.getMessage() and "[REDACTED]" in as_bytes.getMessage()
    assert keys_equal(KEY, KEY) and not keys_equal(KEY[:-1], KEY) and not keys_equal(None, KEY)
