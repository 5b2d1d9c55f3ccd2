"""Word timings over the wire: WebSocket `audio.alignment` events and SSE `speech.audio.alignment` events,
opt-in, in samples of the audio sent, never ahead of it."""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
from pcgtts.server.ws_protocol import AudioAlignment, parse_server_event
from pcgtts.tts import SynthesisOptions
from test_server_ws import collect_until_done, ws_url
from websockets.sync.client import connect

HELD_OUT = "Seven jugglers wandered past the quiet harbour at dawn. Nobody heard them, humming softly."
WORDS = HELD_OUT.replace(".", "").replace(",", "").split()


def service_words(tts_service, text: str, seed: int):
    """The service's own timings (at the codec's rate) for the same text, voice and seed."""
    voice = next(iter(tts_service.preset_voices().values()))

    async def run():
        synth = tts_service.synthesize(text, voice, SynthesisOptions(seed=seed, word_timings=True))
        [c async for c in synth]
        return synth.words

    return asyncio.run(run())


def at_24k(tts_service, sample: int) -> int:
    return round(sample * 24000 / tts_service.sample_rate)


def test_models_say_the_family_aligns(live_server):
    card = httpx.get(live_server.url + "/v1/models", timeout=30).json()["data"][0]
    assert card["pcgtts"]["word_timings"] is True


def test_websocket_reports_each_word_once_its_audio_is_sent(live_server, tts_service):
    preset = next(iter(tts_service.preset_voices()))
    with connect(ws_url(live_server)) as ws:
        ws.recv(timeout=10)
        ws.send(json.dumps({"type": "session.config", "seed": 21, "voice": preset, "word_timings": True,
                            "flush": "sentence"}))
        for piece in (HELD_OUT[:30], HELD_OUT[30:70], HELD_OUT[70:]):
            ws.send(json.dumps({"type": "input.text", "text": piece}))
        ws.send(json.dumps({"type": "input.done"}))
        messages = collect_until_done(ws)
    received, words = 0, []
    for message in messages:
        if isinstance(message, bytes):
            received += len(message) // 2
        elif message["type"] == "audio.alignment":
            event = parse_server_event(message)
            assert isinstance(event, AudioAlignment) and event.utterance_id == 1
            # a word is told once the audio sent has reached its start (the last ones after the end)
            assert all(w.start < received for w in event.words)
            words += event.words
    done = messages[-1]
    assert done["samples"] == received
    assert [w.text for w in words] == WORDS  # every word, once, in order
    assert all(a.end <= b.start for a, b in zip(words, words[1:], strict=False))
    assert all(0 <= w.start < w.end <= received for w in words)  # inside the audio
    expected = service_words(tts_service, HELD_OUT, seed=21)
    assert [(w.start, w.end) for w in words] == [(at_24k(tts_service, w.start), at_24k(tts_service, w.end))
                                                 for w in expected]


def sse_events(server, **body) -> list[dict]:
    request = {"model": "tts-1", "input": HELD_OUT, "response_format": "pcm", "stream_format": "sse", **body}
    with httpx.stream("POST", server.url + "/v1/audio/speech", json=request, timeout=300) as response:
        assert response.status_code == 200
        return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]


def test_sse_carries_alignment_events_when_asked(live_server, tts_service):
    preset = next(iter(tts_service.preset_voices()))
    events = sse_events(live_server, seed=21, voice=preset, word_timings=True)
    assert events[-1]["type"] == "speech.audio.done"
    received, words = 0, []
    for event in events:
        if event["type"] == "speech.audio.delta":
            received += len(base64.b64decode(event["audio"])) // 2
        elif event["type"] == "speech.audio.alignment":
            assert event["sample_rate"] == 24000
            assert all(w["start"] < received for w in event["words"])
            words += event["words"]
    assert [w["text"] for w in words] == WORDS
    assert all(0 <= w["start"] < w["end"] <= received for w in words)
    expected = service_words(tts_service, HELD_OUT, seed=21)
    assert [(w["start"], w["end"]) for w in words] == [
        (at_24k(tts_service, w.start), at_24k(tts_service, w.end)) for w in expected]
    plain = sse_events(live_server, seed=21, voice=preset)
    assert {e["type"] for e in plain} == {"speech.audio.delta", "speech.audio.done"}  # opt-in only


def test_word_timings_need_sse(live_server):
    body = {"model": "tts-1", "input": "Hello.", "response_format": "pcm", "word_timings": True}
    response = httpx.post(live_server.url + "/v1/audio/speech", json=body, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == "word_timings"
