"""The WebSocket stream (/v1/audio/speech/stream) with a real websockets client."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from pcgtts.server.ws_protocol import AudioDone, AudioProgress, parse_server_event
from server_support import aborted, wait_aborted, wait_idle, wait_running
from websockets.sync.client import connect

LONG_TEXT = ("The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore. "
             "How much wood would a woodchuck chuck, if a woodchuck could chuck wood?") * 2


def ws_url(server) -> str:
    return server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"


def collect_until_done(ws, count: int = 1, timeout: float = 120) -> list:
    """Messages (dicts for JSON, bytes for audio) up to the `count`-th audio.done."""
    out, done = [], 0
    while done < count:
        message = ws.recv(timeout=timeout)
        item = message if isinstance(message, bytes) else json.loads(message)
        if isinstance(item, dict):
            parse_server_event(item)  # every event is one of the protocol's (server/ws_protocol.py)
        out.append(item)
        if isinstance(item, dict) and item["type"] == "audio.done":
            done += 1
        assert not (isinstance(item, dict) and item["type"] == "error"), item
    return out


def speak(ws, text: str) -> None:
    ws.send(json.dumps({"type": "input.text", "text": text}))
    ws.send(json.dumps({"type": "input.done"}))


def test_two_utterances_on_one_connection(live_server):
    with connect(ws_url(live_server)) as ws:
        created = json.loads(ws.recv(timeout=10))
        assert created["type"] == "session.created" and created["sample_rate"] == 24000
        ws.send(json.dumps({"type": "session.config", "voice": "alloy", "seed": 3}))
        speak(ws, "Hello there.")
        speak(ws, "A second utterance follows.")
        messages = collect_until_done(ws, count=2)
        ws.send(json.dumps({"type": "session.close"}))
        assert json.loads(ws.recv(timeout=30))["type"] == "session.done"

    utterances: dict[int, dict] = {}
    current = None
    for item in messages:
        if isinstance(item, bytes):
            assert current is not None, "audio before audio.start"
            utterances[current]["pcm"] += item
        elif item["type"] == "audio.start":
            assert current is None or "done" in utterances[current], "utterances overlapped"
            current = item["utterance_id"]
            assert item["format"] == "pcm" and item["sample_rate"] == 24000 and item["channels"] == 1
            utterances[current] = {"pcm": b""}
        elif item["type"] == "audio.done":
            assert item["utterance_id"] == current and not item["cancelled"]
            utterances[current]["done"] = item
    assert sorted(utterances) == [1, 2]
    for u in utterances.values():
        done = u["done"]
        assert done["total_bytes"] == len(u["pcm"]) > 4800 and len(u["pcm"]) % 2 == 0
        assert done["usage"]["output_tokens"] > 0 and done["ttfa_ms"] > 0
        assert done["drafted"] >= done["accepted"] >= 0 and done["drafted"] > 0
        assert 0 <= done["acceptance_rate"] <= 1
    assert any(isinstance(m, dict) and m["type"] == "audio.progress" for m in messages)

    # The first utterance is the same audio the HTTP endpoint gives for the same seed.
    body = {"model": "tts-1", "voice": "alloy", "input": "Hello there.", "response_format": "pcm", "seed": 3}
    http_pcm = httpx.post(live_server.url + "/v1/audio/speech", json=body, timeout=120).content
    a, b = np.frombuffer(utterances[1]["pcm"], "<i2"), np.frombuffer(http_pcm, "<i2")
    assert a.size == b.size and np.max(np.abs(a.astype(int) - b.astype(int))) <= 1


def test_closing_mid_utterance_aborts_and_frees_kv(live_server, tts_service):
    wait_idle(tts_service)
    before = aborted(tts_service)
    with connect(ws_url(live_server)) as ws:
        ws.recv(timeout=10)
        speak(ws, LONG_TEXT)
        while not isinstance(ws.recv(timeout=60), bytes):
            pass
        wait_running(tts_service)
    wait_aborted(tts_service, before)


def test_cancel_stops_the_utterance_and_the_session_goes_on(live_server, tts_service):
    wait_idle(tts_service)
    with connect(ws_url(live_server)) as ws:
        ws.recv(timeout=10)
        speak(ws, LONG_TEXT)
        while not isinstance(first := ws.recv(timeout=60), bytes):
            pass
        ws.send(json.dumps({"type": "input.cancel"}))
        messages = collect_until_done(ws)
        done = messages[-1]
        # A cancelled audio.done has every field a finished one has (the protocol model validates that).
        assert isinstance(parse_server_event(done), AudioDone)
        assert done["cancelled"] is True and done["finish_reason"] == "abort"
        assert done["ttfa_ms"] > 0 and done["audio_seconds"] > 0 and done["usage"]["output_tokens"] > 0
        frames = [first] + [m for m in messages if isinstance(m, bytes)]
        # A frame in flight when the cancel landed may be sent without being counted.
        assert 0 <= sum(map(len, frames)) - done["total_bytes"] <= max(map(len, frames))
        assert done["total_bytes"] == 2 * done["samples"]
        wait_idle(tts_service)  # the cancelled request freed its KV
        speak(ws, "After the cancel.")
        last = collect_until_done(ws)[-1]
        assert last["cancelled"] is False and last["total_bytes"] > 0


@pytest.mark.parametrize(("message", "param"), [
    ("not json", None),
    (json.dumps({"type": "nonsense"}), "type"),
    (json.dumps({"type": "session.config", "speed": 9}), "speed"),
    (json.dumps({"type": "session.config", "response_format": "mp3"}), "response_format"),
    (json.dumps({"type": "input.text", "text": 5}), "text"),
])
def test_bad_messages_get_error_events(live_server, message, param):
    with connect(ws_url(live_server)) as ws:
        ws.recv(timeout=10)
        ws.send(message)
        event = json.loads(ws.recv(timeout=10))
        assert event["type"] == "error" and event["error"]["param"] == param
        assert set(event["error"]) == {"message", "type", "param", "code"}
        ws.send(json.dumps({"type": "session.close"}))  # the session survived the bad message
        assert json.loads(ws.recv(timeout=10))["type"] == "session.done"


def test_unknown_voice_is_an_error_event(live_server):
    with connect(ws_url(live_server)) as ws:
        ws.recv(timeout=10)
        ws.send(json.dumps({"type": "session.config", "voice": "nobody"}))
        speak(ws, "Hello.")
        event = json.loads(ws.recv(timeout=30))
        assert event["type"] == "error" and event["error"]["code"] == "voice_not_found"
        assert event["utterance_id"] == 1


def test_progress_events_trace_acceptance_per_chunk(live_server):
    """audio.progress carries what speculation did for each chunk (the live acceptance trace): the chunks
    add up to the running totals, and mean_accepted_len is tokens per engine step."""
    with connect(ws_url(live_server)) as ws:
        ws.recv(timeout=10)
        ws.send(json.dumps({"type": "session.config", "seed": 5, "acceptance": "pcg"}))
        speak(ws, "Tracing acceptance, one chunk at a time.")
        messages = collect_until_done(ws)
    gamma = live_server.state.service.engine_num_speculative_tokens
    progress = [parse_server_event(m) for m in messages
                if isinstance(m, dict) and m["type"] == "audio.progress"]
    assert len(progress) >= 2 and all(isinstance(p, AudioProgress) for p in progress)
    sums = {"tokens": 0, "steps": 0, "drafted": 0, "accepted": 0}
    for event in progress:
        for name in sums:
            sums[name] += getattr(event.chunk, name)
            assert sums[name] == getattr(event, name)  # cumulative totals = the sum of the chunks so far
        assert 0 <= event.chunk.accepted <= event.chunk.drafted <= gamma * event.chunk.steps
        assert event.mean_accepted_len == pytest.approx(event.tokens / event.steps, abs=1e-4)
        assert 1.0 <= event.mean_accepted_len <= gamma + 1
    assert sums["drafted"] > 0
    done = messages[-1]
    assert done["steps"] >= progress[-1].steps and done["tokens"] >= progress[-1].tokens


def test_readme_documents_the_protocol_the_server_speaks():
    """The README's WebSocket section is the text generated from server/ws_protocol.py (one source)."""
    from pathlib import Path

    from pcgtts.server.routes.ws import PROTOCOL

    root = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
    readme = (root / "README.md").read_text()
    assert PROTOCOL in readme
