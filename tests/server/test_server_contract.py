"""Smaller disagreements between the API and its documentation, found by the fuzzer and by hand: method
errors, the OpenAPI formats, voice names that differ only by case, retried uploads, the per-connection
utterance queue, admission once per request."""

from __future__ import annotations

import asyncio
import io
import json

import httpx
import numpy as np
import soundfile as sf
from pcgtts.tts import SynthesisOptions
from server_support import tone, wait_idle
from websockets.sync.client import connect


def wav_bytes(audio: np.ndarray, rate: int = 22050) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, audio, rate, format="WAV")
    return buf.getvalue()


def upload(url: str, name: str, data: bytes, transcript: str = "a short test clip") -> httpx.Response:
    return httpx.post(url + "/v1/audio/voices", data={"name": name, "transcript": transcript},
                      files={"audio_sample": ("clip.wav", data)}, timeout=60)


def test_wrong_methods_are_client_errors_with_the_full_allow_list(live_server):
    wrong = httpx.put(live_server.url + "/v1/audio/voices")
    assert wrong.status_code == 405 and wrong.json()["error"]["type"] == "invalid_request_error"
    assert set(wrong.headers["allow"].split(", ")) == {"GET", "POST", "OPTIONS"}
    options = httpx.options(live_server.url + "/v1/audio/speech")
    assert options.status_code == 204 and set(options.headers["allow"].split(", ")) == {"POST", "OPTIONS"}


def test_openapi_lists_every_served_format_and_the_real_ranges(live_server):
    schema = httpx.get(live_server.url + "/openapi.json").json()
    content = schema["paths"]["/v1/audio/speech"]["post"]["responses"]["200"]["content"]
    assert {"audio/basic", "audio/x-alaw-basic", "audio/mpeg", "audio/pcm"} <= set(content)
    fields = schema["components"]["schemas"]["SpeechRequest"]["properties"]
    gamma = fields["num_speculative_tokens"]["anyOf"][0]
    most = live_server.state.service.engine_num_speculative_tokens  # the model's
    assert gamma["minimum"] == 1 and gamma["maximum"] == most
    for name in ("temperature", "top_p", "top_k", "repetition_penalty", "seed", "max_tokens", "speed"):
        spec = fields[name]["anyOf"][0] if "anyOf" in fields[name] else fields[name]
        assert "minimum" in spec and "maximum" in spec, name


def test_voice_names_differ_by_more_than_case_and_retried_uploads_are_idempotent(live_server):
    url = live_server.url
    preset = httpx.get(url + "/v1/audio/voices").json()["data"][0]["name"]
    clash = upload(url, preset.upper(), wav_bytes(tone(1.5)))
    assert clash.status_code == 409 and clash.json()["error"]["code"] == "voice_exists"

    clip = wav_bytes(tone(1.5, freq=150.0))
    first = upload(url, "Ärger Straße", clip)
    assert first.status_code == 201, first.text
    retry = upload(url, "Ärger Straße", clip)  # the reply to the first was lost; the client retries
    assert retry.status_code == 200 and retry.json()["id"] == first.json()["id"]
    folded = upload(url, "ÄRGER STRASSE", clip)  # Unicode case folding: ß = ss, Ä = ä
    assert folded.status_code == 200 and folded.json()["id"] == first.json()["id"]
    other = upload(url, "ärger straße", wav_bytes(tone(1.5, freq=200.0)))
    assert other.status_code == 409
    listed = [v["name"] for v in httpx.get(url + "/v1/audio/voices").json()["data"]]
    assert listed.count("Ärger Straße") == 1
    assert httpx.delete(url + f"/v1/audio/voices/{first.json()['id']}").status_code == 200


def test_one_connection_cannot_queue_unlimited_utterances(live_server, tts_service):
    from pcgtts.server.routes.ws import MAX_QUEUED

    wait_idle(tts_service)
    with connect(live_server.url.replace("http://", "ws://") + "/v1/audio/speech/stream") as ws:
        ws.recv(timeout=10)
        for i in range(MAX_QUEUED + 4):
            ws.send(json.dumps({"type": "input.text", "text": f"Utterance {i}."}))
            ws.send(json.dumps({"type": "input.done"}))
        refused = 0
        while refused < 2:
            message = ws.recv(timeout=60)
            if isinstance(message, str) and json.loads(message)["type"] == "error":
                assert json.loads(message)["error"]["code"] == "too_many_utterances"
                refused += 1
        ws.send(json.dumps({"type": "input.cancel"}))
    wait_idle(tts_service)


def test_admitted_requests_are_never_refused_for_later_sentences(tts_service):
    """A full waiting queue refuses new requests (429) but never the next sentence of an admitted one."""
    engine = tts_service.engine
    text = "First sentence here. Second sentence here. Third sentence here."

    async def run() -> tuple[bool, int]:
        synth = tts_service.synthesize(text, None, SynthesisOptions(seed=1, max_tokens=40))
        first = await synth.__anext__()  # admitted
        limit = engine.config.max_waiting
        engine.config.max_waiting = 0  # from now on the queue counts as full for newcomers
        try:
            refused = 0
            try:
                async for _ in tts_service.synthesize("A newcomer.", None, SynthesisOptions(seed=2)):
                    pass
            except Exception as exc:  # noqa: BLE001
                refused = type(exc).__name__ == "ServiceOverloaded"
            samples = first.size + sum([c.size async for c in synth])
        finally:
            engine.config.max_waiting = limit
        assert samples > 0
        return refused, synth.stats.sentences

    refused, sentences = asyncio.run(run())
    assert refused and sentences == 3
    wait_idle(tts_service)


def test_utterances_of_a_token_or_two_are_served(live_server):
    """Found by the fuzzer: a 2-token utterance is a codec block shorter than the STFT's reflect padding.
    The fewest tokens that make audio are served; fewer are a 400 naming that smallest value."""
    smallest = live_server.state.service.min_max_tokens
    for max_tokens in (smallest, smallest + 1, smallest + 2):
        for fmt in ("wav", "mp3"):
            body = {"input": "0", "max_tokens": max_tokens, "temperature": 0, "top_p": 0.01,
                    "repetition_penalty": 0.1, "seed": 0, "response_format": fmt}
            response = httpx.post(live_server.url + "/v1/audio/speech", json=body, timeout=120)
            assert response.status_code == 200, (max_tokens, fmt, response.text)
            assert sf.info(io.BytesIO(response.content)).frames > 0 if fmt == "wav" else response.content
    for max_tokens in range(1, smallest):
        response = httpx.post(live_server.url + "/v1/audio/speech",
                              json={"input": "0", "max_tokens": max_tokens})
        assert response.status_code == 400 and f"at least {smallest}" in response.json()["error"]["message"]
