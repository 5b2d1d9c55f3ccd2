"""SIGTERM drains a real `pcgtts serve` process: /ready turns 503 at once, new work is refused, streams in
flight finish (or, past the drain deadline, end with an in-band word), and the process exits 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from server_support import free_port
from websockets.sync.client import connect

LONG = ("The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore. "
        "How much wood would a woodchuck chuck, if a woodchuck could chuck wood? ")


KEY = "drain-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


class ServeProcess:
    def __init__(self, bundle, tmp_path, drain_timeout: float):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PCGTTS_MODEL": str(bundle), "PCGTTS_PORT": str(self.port),
               "PCGTTS_DATA_DIR": str(tmp_path), "PCGTTS_LOG_LEVEL": "info",
               "PCGTTS_DRAIN_TIMEOUT_S": str(drain_timeout), "PCGTTS_API_KEY": KEY}
        self.log = tmp_path / "serve.log"
        self.process = subprocess.Popen([sys.executable, "-m", "pcgtts.cli", "serve"], env=env,
                                        stdout=subprocess.DEVNULL, stderr=self.log.open("w"))
        deadline = time.monotonic() + 180
        while self.ready() != 200:
            assert self.process.poll() is None and time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.2)

    def ready(self) -> int | None:
        try:
            return httpx.get(self.url + "/ready", timeout=5).status_code
        except httpx.TransportError:
            return None

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class SSEClient(threading.Thread):
    """Reads one SSE speech stream to its end in a thread; `first_audio` is set at the first delta."""

    def __init__(self, url: str, text: str):
        super().__init__(daemon=True)
        self.url, self.text = url, text
        self.events: list[dict] = []
        self.first_audio = threading.Event()

    def run(self) -> None:
        body = {"input": self.text, "stream_format": "sse", "response_format": "pcm", "seed": 1}
        with httpx.stream("POST", self.url + "/v1/audio/speech", json=body, headers=AUTH,
                          timeout=300) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    self.events.append(json.loads(line[6:]))
                    self.first_audio.set()


class RawClient(threading.Thread):
    """Reads one raw PCM speech stream in a thread: the request id, the bytes, and how the transfer ended."""

    def __init__(self, url: str, text: str):
        super().__init__(daemon=True)
        self.url, self.text = url, text
        self.first_audio = threading.Event()
        self.request_id, self.received, self.ended = None, 0, None

    def run(self) -> None:
        body = {"input": self.text, "response_format": "pcm", "seed": 3}
        try:
            with httpx.stream("POST", self.url + "/v1/audio/speech", json=body, headers=AUTH,
                              timeout=300) as response:
                self.request_id = response.headers["x-request-id"]
                for chunk in response.iter_bytes():
                    self.received += len(chunk)
                    self.first_audio.set()
            self.ended = "complete"
        except httpx.RemoteProtocolError:  # the body's last chunk never came
            self.ended = "cut"


def ws_utterance(url: str, text: str, started: threading.Event, out: list) -> None:
    # the old query form of the key, so that the log check below sees it redacted
    with connect(url.replace("http://", "ws://") + f"/v1/audio/speech/stream?api_key={KEY}") as ws:
        ws.recv(timeout=30)  # session.created
        ws.send(json.dumps({"type": "input.text", "text": text}))
        ws.send(json.dumps({"type": "input.done"}))
        try:
            while True:
                message = ws.recv(timeout=300)
                if isinstance(message, bytes):
                    started.set()
                    continue
                out.append(json.loads(message))
        except Exception as exc:  # the server closes the socket at the end of the drain
            out.append({"closed": getattr(getattr(exc, "rcvd", None), "code", None)})


def whole_response(url: str, text: str, out: list) -> None:
    """stream=false: nothing is sent before the end, so a cut request gets a plain 503."""
    body = {"input": text, "stream": False, "response_format": "wav", "seed": 2}
    out.append(httpx.post(url + "/v1/audio/speech", json=body, headers=AUTH, timeout=300))


def start_streams(server: ServeProcess, text: str):
    sse = SSEClient(server.url, text)
    sse.start()
    ws_started, ws_out = threading.Event(), []
    ws = threading.Thread(target=ws_utterance, args=(server.url, text, ws_started, ws_out), daemon=True)
    ws.start()
    assert sse.first_audio.wait(120) and ws_started.wait(120), server.log.read_text()
    return sse, ws, ws_out


@pytest.mark.slow
def test_sigterm_lets_streams_in_flight_finish_then_exits_zero(demo_bundle, tmp_path):
    server = ServeProcess(demo_bundle, tmp_path, drain_timeout=240)
    try:
        sse, ws, ws_out = start_streams(server, LONG)
        server.process.send_signal(signal.SIGTERM)
        seen = [server.ready() for _ in range(3)]
        assert 503 in seen and 200 not in seen[seen.index(503):], seen
        refused = httpx.post(server.url + "/v1/audio/speech", json={"input": "Hi."}, headers=AUTH, timeout=30)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "server_shutting_down"
        sse.join(300)
        ws.join(300)
        assert server.process.wait(120) == 0, server.log.read_text()
    finally:
        server.close()
    assert sse.events[-1]["type"] == "speech.audio.done", sse.events[-1]
    assert sum(e["type"] == "speech.audio.delta" for e in sse.events) > 1
    done = [m for m in ws_out if m.get("type") == "audio.done"]
    assert len(done) == 1 and done[0]["cancelled"] is False and done[0]["finish_reason"] in ("stop", "length")
    assert {"type": "session.done", "reason": "server_shutdown"} in ws_out
    assert ws_out[-1] == {"closed": 1001}
    log = server.log.read_text()
    assert "api_key=[REDACTED]" in log and KEY not in log


@pytest.mark.slow
def test_streams_past_the_drain_deadline_end_with_a_word_and_exit_is_zero(demo_bundle, tmp_path):
    server = ServeProcess(demo_bundle, tmp_path, drain_timeout=1.0)
    try:
        whole: list = []
        waiter = threading.Thread(target=whole_response, args=(server.url, LONG * 12, whole), daemon=True)
        waiter.start()
        raw = RawClient(server.url, LONG * 12)
        raw.start()
        sse, ws, ws_out = start_streams(server, LONG * 12)
        assert raw.first_audio.wait(120), server.log.read_text()
        server.process.send_signal(signal.SIGTERM)
        readiness = server.ready()
        in_flight = sse.is_alive() and ws.is_alive() and raw.is_alive()
        assert readiness == 503 and in_flight  # /ready says so while the streams still run
        for client in (sse, ws, waiter, raw):
            client.join(120)
        assert server.process.wait(120) == 0, server.log.read_text()
    finally:
        server.close()
    # the raw stream: an unfinished transfer for the client, one INFO line naming it in the log, no error
    assert raw.ended == "cut" and raw.received > 0
    log = server.log.read_text()
    cut = [line for line in log.splitlines() if "cut at the drain deadline" in line]
    assert len(cut) == 1 and " INFO " in cut[0] and raw.request_id in cut[0], cut
    assert "ERROR" not in log and "Traceback" not in log, log[-4000:]
    assert whole[0].status_code == 503 and whole[0].json()["error"]["code"] == "server_shutdown"
    assert sse.events[-1]["type"] == "speech.audio.error", sse.events[-1]
    assert sse.events[-1]["error"]["code"] == "server_shutdown"
    done = [m for m in ws_out if m.get("type") == "audio.done"]
    assert len(done) == 1 and done[0]["cancelled"] is True and done[0]["reason"] == "server_shutdown"
    assert ws_out[-1] == {"closed": 1001}
    assert "drained in" in server.log.read_text()


def ws_waiting_for_text(url: str, pieces: list[str], wait_for_audio: bool, ready: threading.Event,
                        out: list) -> None:
    """A sentence-mode utterance whose text stops arriving mid-sentence (the agent's LLM stalled). `ready`:
    the server has read the text (a bad message sent after it has been answered) and, if asked, audio came."""
    with connect(url.replace("http://", "ws://") + "/v1/audio/speech/stream", additional_headers=AUTH) as ws:
        ws.recv(timeout=30)
        ws.send(json.dumps({"type": "session.config", "flush": "sentence", "flush_max_chars": None}))
        for piece in pieces:
            ws.send(json.dumps({"type": "input.text", "text": piece}))
        ws.send(json.dumps({"type": "nonsense"}))  # answered in order: the text before it has been read
        read, heard = False, not wait_for_audio
        try:
            while True:
                message = ws.recv(timeout=300)
                if isinstance(message, bytes):
                    heard = True
                else:
                    out.append(json.loads(message))
                    read = read or out[-1]["type"] == "error"
                if read and heard:
                    ready.set()
        except Exception as exc:
            out.append({"closed": getattr(getattr(exc, "rcvd", None), "code", None)})


@pytest.mark.slow
def test_sentence_mode_utterances_waiting_for_text_are_cut_at_the_drain_deadline(demo_bundle, tmp_path):
    """One utterance has spoken its first sentence and waits for the rest, another waits for its first
    sentence to end: past the deadline both end cancelled with the shutdown reason; the process exits 0."""
    server = ServeProcess(demo_bundle, tmp_path, drain_timeout=1.0)
    try:
        spoken, started = [], threading.Event()
        waiting, queued = [], threading.Event()
        clients = [threading.Thread(target=ws_waiting_for_text, daemon=True, args=(
                       server.url, ["Hello there. And then the", " rest never"], True, started, spoken)),
                   threading.Thread(target=ws_waiting_for_text, daemon=True, args=(
                       server.url, ["Still waiting for the end of"], False, queued, waiting))]
        for client in clients:
            client.start()
        assert started.wait(120) and queued.wait(120), server.log.read_text()
        server.process.send_signal(signal.SIGTERM)
        for client in clients:
            client.join(120)
        assert server.process.wait(120) == 0, server.log.read_text()
    finally:
        server.close()
    for out in (spoken, waiting):
        done = [m for m in out if m.get("type") == "audio.done"]
        assert len(done) == 1 and done[0]["cancelled"] is True and done[0]["reason"] == "server_shutdown", out
        assert {"type": "session.done", "reason": "server_shutdown"} in out and out[-1] == {"closed": 1001}
    assert [m for m in spoken if m.get("type") == "audio.done"][0]["total_bytes"] > 0
