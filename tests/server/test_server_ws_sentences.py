"""The WebSocket's sentence mode (`"flush": "sentence"`): a voice agent streams its LLM's answer and hears
each sentence while the rest is still being written; barge-in stops it within one engine step."""

from __future__ import annotations

import json
import threading
import time

import httpx
import numpy as np
import pytest
from pcgtts.bench.voice_agent import llm_pieces
from server_support import wait_idle, wait_until
from test_server_ws import collect_until_done, ws_url
from websockets.sync.client import connect

ANSWER = ("Sure, here is what I found. The quick brown fox jumps over the lazy dog, twice. "
          "Dr. Brown says it costs 2.5 dollars. That is all.")



def send_text(ws, pieces, pace_s: float = 0.0) -> None:
    for piece in pieces:
        ws.send(json.dumps({"type": "input.text", "text": piece}))
        if pace_s:
            time.sleep(pace_s)


def first_audio(ws, timeout: float = 120) -> list:
    """Messages up to and including the first binary frame (failing on an error event)."""
    out = []
    while True:
        message = ws.recv(timeout=timeout)
        out.append(message if isinstance(message, bytes) else json.loads(message))
        if isinstance(message, bytes):
            return out
        assert out[-1]["type"] != "error", out[-1]


def http_pcm(server, text: str, **fields) -> np.ndarray:
    body = {"model": "tts-1", "input": text, "response_format": "pcm", **fields}
    response = httpx.post(server.url + "/v1/audio/speech", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return np.frombuffer(response.content, "<i2")


def pcm_of(messages) -> np.ndarray:
    return np.frombuffer(b"".join(m for m in messages if isinstance(m, bytes)), "<i2")


def longest_silence(pcm: np.ndarray) -> int:
    """Samples in the longest run of (near) silence."""
    quiet = np.abs(pcm.astype(np.int32)) <= 1
    edges = np.flatnonzero(np.diff(np.concatenate([[0], quiet.astype(np.int8), [0]])))
    return int((edges[1::2] - edges[::2]).max()) if edges.size else 0


def test_sentences_are_spoken_while_the_answer_arrives_as_one_utterance(live_server, tts_service):
    """The first audio comes while the client has sent only the first sentence and the next word's first
    letter; the answer streamed at an LLM's pace is one utterance whose audio is the whole text's (same
    seed, same sentence split), with no silence at the sentence joins longer than one codec block."""
    first_end = ANSWER.index(". ") + 3  # the first sentence, its space and one letter of the next
    with connect(ws_url(live_server)) as ws:
        ws.recv(timeout=10)
        ws.send(json.dumps({"type": "session.config", "flush": "sentence", "seed": 11, "voice": "alloy"}))
        send_text(ws, llm_pieces(ANSWER[:first_end], seed=1))
        before = first_audio(ws)  # nothing more is sent until audio arrives
        send_text(ws, llm_pieces(ANSWER[first_end:], seed=2), pace_s=1 / 30)
        ws.send(json.dumps({"type": "input.done"}))
        messages = before + collect_until_done(ws)
    events = [m for m in messages if isinstance(m, dict)]
    assert [e["type"] for e in events if e["type"] != "audio.progress"] == ["audio.start", "audio.done"]
    done = events[-1]
    assert done["finish_reason"] == "stop" and not done["cancelled"]
    pcm = pcm_of(messages)
    assert done["total_bytes"] == 2 * pcm.size
    assert len(tts_service.segments(ANSWER)) >= 4
    whole = http_pcm(live_server, ANSWER, seed=11, voice="alloy")
    assert pcm.size == whole.size and np.max(np.abs(pcm.astype(int) - whole.astype(int))) <= 1
    codec = tts_service.codec
    block = codec.gl.block * codec.spec.hop * 24000 // codec.sample_rate  # one codec block at 24 kHz
    assert 0 < longest_silence(pcm) <= block  # the sentence pauses, nothing longer


def test_a_config_sent_mid_utterance_applies_to_the_next(live_server):
    first, second = "Hello there. How are you?", "Fine, thanks."
    with connect(ws_url(live_server)) as ws:
        ws.recv(timeout=10)
        ws.send(json.dumps({"type": "session.config", "flush": "sentence", "seed": 5, "voice": "alloy"}))
        send_text(ws, ["Hello there. H"])
        before = first_audio(ws)
        ws.send(json.dumps({"type": "session.config", "flush": "sentence", "seed": 6, "voice": "echo"}))
        send_text(ws, ["ow are you?"])
        ws.send(json.dumps({"type": "input.done"}))
        send_text(ws, [second])
        ws.send(json.dumps({"type": "input.done"}))
        messages = before + collect_until_done(ws, count=2)
    done = [i for i, m in enumerate(messages) if isinstance(m, dict) and m["type"] == "audio.done"]
    one, two = pcm_of(messages[:done[0]]), pcm_of(messages[done[0]:])
    for pcm, text, fields in ((one, first, {"seed": 5, "voice": "alloy"}),
                              (two, second, {"seed": 6, "voice": "echo"})):
        whole = http_pcm(live_server, text, **fields)
        assert pcm.size == whole.size and np.max(np.abs(pcm.astype(int) - whole.astype(int))) <= 1


@pytest.mark.parametrize(("config", "clause"), [
    ({"flush_max_chars": 30}, "one two three four five six seven eight nine ten eleven "),
    ({"flush_max_ms": 100, "flush_max_chars": None}, "a clause whose end is late "),
])
def test_a_long_clause_is_spoken_before_its_full_stop(live_server, config, clause):
    with connect(ws_url(live_server)) as ws:
        ws.recv(timeout=10)
        ws.send(json.dumps({"type": "session.config", "flush": "sentence", "seed": 2, **config}))
        send_text(ws, llm_pieces(clause, seed=3))
        assert isinstance(first_audio(ws)[-1], bytes)  # no full stop, no input.done: the bound spoke
        send_text(ws, ["and its end."])
        ws.send(json.dumps({"type": "input.done"}))
        done = collect_until_done(ws)[-1]
    assert done["finish_reason"] == "stop" and done["total_bytes"] > 0


@pytest.mark.parametrize(("config", "param"), [
    ({"flush": "word"}, "flush"),
    ({"flush_max_chars": 0}, "flush_max_chars"),
    ({"flush_max_ms": "soon"}, "flush_max_ms"),
])
def test_bad_flush_settings_are_error_events(live_server, config, param):
    with connect(ws_url(live_server)) as ws:
        ws.recv(timeout=10)
        ws.send(json.dumps({"type": "session.config", **config}))
        event = json.loads(ws.recv(timeout=10))
        assert event["type"] == "error" and event["error"]["param"] == param


class StepGate:
    """The engine thread's real steps, counted, with a gate: while `hold` is set the next step waits (its
    start announced by `parked`) until `go` is set."""

    def __init__(self, engine):
        self.engine, self.real = engine, engine.step
        self.steps = 0
        self.hold, self.parked, self.go = threading.Event(), threading.Event(), threading.Event()

    def step(self):
        if self.hold.is_set():
            self.parked.set()
            self.go.wait(60)
        self.steps += 1
        return self.real()

    def __enter__(self):
        self.engine.step = self.step
        return self

    def __exit__(self, *exc):
        self.go.set()
        del self.engine.step  # the class's own again


def test_barge_in_stops_the_engine_within_one_step_and_drops_unspoken_sentences(live_server, tts_service):
    wait_idle(tts_service)
    before = tts_service.engine_stats().finished
    long_first = "This first sentence goes on for quite a while, so that it is still being spoken. "
    with connect(ws_url(live_server)) as ws, StepGate(tts_service.engine.engine) as gate:
        ws.recv(timeout=10)
        ws.send(json.dumps({"type": "session.config", "flush": "sentence", "seed": 4}))
        send_text(ws, [long_first, "A second sentence is complete. And a third is"])
        first_audio(ws)
        gate.hold.set()
        assert gate.parked.wait(60), "the engine took no further step"
        parked_at = gate.steps  # the engine is at the start of a step, holding the utterance's request
        ws.send(json.dumps({"type": "input.cancel"}))
        done = collect_until_done(ws)[-1]  # answered while the engine still waits at the gate
        assert done["cancelled"] is True and done["finish_reason"] == "abort"
        gate.hold.clear()
        gate.go.set()
        wait_idle(tts_service)
        assert gate.steps - parked_at <= 1  # the step under way when the cancel came, and no other
        after = tts_service.engine_stats().finished
        # one engine request ever ran for the utterance (its first sentence), and it was aborted
        assert sum(after.values()) - sum(before.values()) == 1
        assert after.get("abort", 0) == before.get("abort", 0) + 1
        ws.send(json.dumps({"type": "input.text", "text": "After the cancel. "}))
        ws.send(json.dumps({"type": "input.done"}))
        last = collect_until_done(ws)[-1]
        assert last["cancelled"] is False and last["total_bytes"] > 0
    wait_until(lambda: tts_service.engine_stats().num_running == 0, "the engine is still busy")


def test_session_close_speaks_the_text_that_arrived_to_its_end(live_server):
    with connect(ws_url(live_server)) as ws:
        ws.recv(timeout=10)
        ws.send(json.dumps({"type": "session.config", "flush": "sentence", "seed": 7}))
        send_text(ws, ["Closing now. And this last clause has no full stop"])
        ws.send(json.dumps({"type": "session.close"}))
        messages = collect_until_done(ws)
        assert json.loads(ws.recv(timeout=60))["type"] == "session.done"
    done = messages[-1]
    assert done["finish_reason"] == "stop" and done["total_bytes"] > 0
    whole = http_pcm(live_server, "Closing now. And this last clause has no full stop", seed=7)
    assert pcm_of(messages).size == whole.size


def test_closing_the_socket_while_text_still_arrives_frees_the_engine(live_server, tts_service):
    wait_idle(tts_service)
    aborts = tts_service.engine_stats().finished.get("abort", 0)
    with connect(ws_url(live_server)) as ws:
        ws.recv(timeout=10)
        ws.send(json.dumps({"type": "session.config", "flush": "sentence"}))
        send_text(ws, ["This first sentence goes on for quite a while, so that it is still spoken. Then"])
        first_audio(ws)
    wait_idle(tts_service)  # KV freed ...
    assert tts_service.engine_stats().finished.get("abort", 0) == aborts + 1  # ... by an abort


def test_input_done_after_only_whitespace_is_an_empty_input_error(live_server):
    with connect(ws_url(live_server)) as ws:
        ws.recv(timeout=10)
        ws.send(json.dumps({"type": "session.config", "flush": "sentence"}))
        send_text(ws, [" ", "\n "])
        ws.send(json.dumps({"type": "input.done"}))
        event = json.loads(ws.recv(timeout=10))
        assert event["type"] == "error" and event["error"]["code"] == "empty_input"
        send_text(ws, ["Then words. "])  # the session goes on
        ws.send(json.dumps({"type": "input.done"}))
        assert collect_until_done(ws)[-1]["finish_reason"] == "stop"
