"""Streaming behaviour: early first bytes, streamed == whole output, seamless joins, aborts on disconnect,
shared batches under concurrency."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import numpy as np
import openai
import pytest
from pcgtts.tts import SynthesisOptions
from prometheus_client.parser import text_string_to_metric_families
from server_support import aborted, wait_aborted, wait_idle, wait_running, wait_until

LONG_TEXT = ("The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore. "
             "How much wood would a woodchuck chuck, if a woodchuck could chuck wood?")
TWO_SENTENCES = "The quick brown fox jumps over the lazy dog. She sells shells."


def metric(url: str, name: str, **labels) -> float:
    text = httpx.get(url + "/metrics").text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def test_first_bytes_arrive_while_generation_is_still_running(live_server, tts_service):
    wait_idle(tts_service)
    body = {"model": "tts-1", "voice": "alloy", "input": TWO_SENTENCES, "response_format": "pcm", "seed": 5}
    received, running_at_first, tokens_at_first = [], None, None
    with httpx.stream("POST", live_server.url + "/v1/audio/speech", json=body, timeout=120) as response:
        assert response.status_code == 200
        for chunk in response.iter_bytes():
            if chunk and running_at_first is None:
                stats = tts_service.engine_stats()
                running_at_first, tokens_at_first = stats.num_running, stats.generation_tokens
            received.append(chunk)
    assert running_at_first >= 1, "the first audio bytes came only after generation had finished"
    assert tokens_at_first < tts_service.engine_stats().generation_tokens
    assert len(received[0]) < 0.5 * sum(map(len, received))


def test_streamed_pcm_equals_whole_pcm_for_the_same_seed(live_server):
    client = openai.OpenAI(base_url=live_server.url + "/v1", api_key="-", max_retries=0, timeout=120)
    args = dict(model="tts-1", voice="alloy", input=TWO_SENTENCES, response_format="pcm")
    with client.audio.speech.with_streaming_response.create(**args, extra_body={"seed": 21}) as response:
        pieces = list(response.iter_bytes())
    streamed = np.frombuffer(b"".join(pieces), "<i2").astype(np.int32)
    whole_response = client.audio.speech.create(**args, extra_body={"seed": 21, "stream": False})
    assert "content-length" in whole_response.response.headers
    assert int(whole_response.response.headers["x-pcgtts-output-tokens"]) > 0
    whole = np.frombuffer(whole_response.read(), "<i2").astype(np.int32)
    assert len(pieces) > 2 and streamed.size == whole.size > 24000
    # The stream resamples chunk by chunk, the whole response in one pass: at most a rounding step apart.
    assert np.max(np.abs(streamed - whole)) <= 1


def test_chunk_joins_have_no_discontinuity(tts_service, record_property):
    """Where streamed chunks meet, the audio is the one-pass decode's, and sample-to-sample jumps there are no
    larger than the largest inside chunks."""
    async def chunks():
        synth = tts_service.synthesize(TWO_SENTENCES, None, SynthesisOptions(seed=2))
        return [chunk async for chunk in synth]

    pieces = asyncio.run(chunks())
    audio = np.concatenate(pieces)
    joins = np.cumsum([p.size for p in pieces])[:-1]
    assert joins.size >= 4
    # Joins are where blocks were decoded separately: the stream equals a one-pass decode exactly, so no
    # join adds a step the signal does not have.
    whole = asyncio.run(_whole(tts_service))
    assert np.array_equal(audio, whole)
    # The same seen on the samples. Not a high quantile of the inside jumps: with a dozen joins one lands on
    # one of the signal's own large steps now and then (it did at p99.9 with 13 joins).
    jumps = np.abs(np.diff(audio))  # jumps[i] = |audio[i + 1] - audio[i]|
    at_joins = jumps[joins - 1]
    inside = np.delete(jumps, joins - 1)
    record_property("max_join_jump", float(at_joins.max()))
    record_property("max_inside_jump", float(inside.max()))
    assert at_joins.max() <= inside.max(), (at_joins.max(), inside.max())


async def _whole(service) -> np.ndarray:
    synth = service.synthesize(TWO_SENTENCES, None, SynthesisOptions(seed=2, streaming=False))
    return np.concatenate([chunk async for chunk in synth])


def test_client_disconnect_aborts_generation_and_frees_kv(live_server, tts_service):
    wait_idle(tts_service)
    aborted_before = metric(live_server.url, "pcgtts:requests_total", status="aborted")
    engine_aborts = tts_service.engine_stats().finished.get("abort", 0)
    body = {"model": "tts-1", "voice": "alloy", "input": LONG_TEXT * 3, "response_format": "pcm"}
    with httpx.stream("POST", live_server.url + "/v1/audio/speech", json=body, timeout=120) as response:
        next(response.iter_bytes())
        wait_running(tts_service)
    wait_idle(tts_service)  # KV freed ...
    assert tts_service.engine_stats().finished.get("abort", 0) == engine_aborts + 1  # ... by an abort
    wait_until(lambda: metric(live_server.url, "pcgtts:requests_total", status="aborted") > aborted_before,
               "the aborted request was not counted")


def test_concurrent_streams_share_the_engine_batch(live_server, tts_service):
    wait_idle(tts_service)
    before = tts_service.engine_stats()

    async def one(client: httpx.AsyncClient, i: int) -> int:
        body = {"model": "tts-1", "voice": "alloy", "input": f"Stream {i} says hi.", "response_format": "pcm",
                "seed": i}
        async with client.stream("POST", "/v1/audio/speech", json=body) as response:
            assert response.status_code == 200
            return len(await response.aread())

    async def run() -> list[int]:
        async with httpx.AsyncClient(base_url=live_server.url, timeout=120) as client:
            return await asyncio.gather(*(one(client, i) for i in range(4)))

    sizes = asyncio.run(run())
    assert all(size > 4800 for size in sizes)
    after = tts_service.engine_stats()
    rows, steps = after.batch_tokens - before.batch_tokens, after.steps - before.steps
    assert rows > steps, "concurrent requests never shared a batch"  # some step decoded 2+ sequences


def test_speed_scales_duration(live_server):
    url = live_server.url + "/v1/audio/speech"
    body = {"model": "tts-1", "voice": "alloy", "input": "Speed test.", "response_format": "pcm", "seed": 9}
    normal = len(httpx.post(url, json=body, timeout=120).content)
    for speed in (0.5, 2.0):
        changed = len(httpx.post(url, json={**body, "speed": speed}, timeout=120).content)
        assert changed / normal == pytest.approx(1 / speed, rel=0.08), speed


def test_disconnect_before_the_first_audio_aborts_too(live_server, tts_service):
    """A client that gives up while waiting for the first chunk (no headers sent yet) frees its request."""
    wait_idle(tts_service)
    before = aborted(tts_service)
    body = json.dumps({"model": "tts-1", "voice": "alloy", "input": LONG_TEXT, "response_format": "pcm"})
    request = (f"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n{body}").encode()
    with socket.create_connection(("127.0.0.1", live_server.port)) as sock:
        sock.sendall(request)
        wait_running(tts_service)  # generating, no audio yet: the codec needs a full first block
    wait_aborted(tts_service, before)
