"""One client can never hurt another: poisoned requests beside running streams (chunked HTTP, SSE and
WebSocket), and a client that leaves mid-stream. Out-of-range values are refused at the API with a 400
naming the range; a request that fails inside the engine step fails alone; a client that leaves is
aborted; every other stream completes with the audio it gets when it runs alone."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from dataclasses import replace

import httpx
import numpy as np
import pytest
from pcgtts.engine.errors import RequestFailed
from pcgtts.engine.speech.base import DecodeConstraint
from pcgtts.tts import SynthesisOptions
from server_support import wait_idle, wait_until
from test_server_streaming import metric
from websockets.sync.client import connect

TEXT = ("The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore. "
        "How much wood would a woodchuck chuck, if a woodchuck could chuck wood?")

# body fields -> the parameter the 400 names (each once broke the engine step for everyone, or would)
API_POISONS = [
    ({"top_k": 9223372036854775808}, "top_k"),
    ({"top_k": 10**7}, "top_k"),
    ({"repetition_penalty": 1e-300}, "repetition_penalty"),
    ({"temperature": 1e-40}, "temperature"),
    ({"top_p": 1e-300}, "top_p"),
    ({"max_tokens": 10**12}, "max_tokens"),
    ({"seed": 2**64}, "seed"),
    ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"speed": 1e308 * 10}, "speed"),  # inf
]


class FailsAfter(DecodeConstraint):
    """Raises inside the batched step once its request has a few tokens: a fault no validation can see."""

    def apply(self, logits, histories):
        if any(len(h) >= 3 for h in histories):
            raise RuntimeError("poisoned request")
        return logits


def pcm_of_sse(events: list[dict]) -> bytes:
    return b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")


def http_stream(url: str, seed: int, sse: bool, started: threading.Event | None = None) -> dict:
    body = {"input": TEXT, "response_format": "pcm", "seed": seed, "stream_format": "sse" if sse else "audio"}
    out = {"events": [], "pcm": b""}
    with httpx.stream("POST", url + "/v1/audio/speech", json=body, timeout=300) as response:
        assert response.status_code == 200
        if sse:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    out["events"].append(json.loads(line[6:]))
                    if started is not None:
                        started.set()
            out["pcm"] = pcm_of_sse(out["events"])
        else:
            for data in response.iter_bytes():
                out["pcm"] += data
                if started is not None:
                    started.set()
    return out


def ws_stream(url: str, seed: int, started: threading.Event | None = None) -> dict:
    out = {"messages": [], "pcm": b""}
    with connect(url.replace("http://", "ws://") + "/v1/audio/speech/stream") as ws:
        ws.recv(timeout=30)
        ws.send(json.dumps({"type": "session.config", "seed": seed}))
        ws.send(json.dumps({"type": "session.config", "top_k": 2**63}))  # refused; the session goes on
        ws.send(json.dumps({"type": "input.text", "text": TEXT}))
        ws.send(json.dumps({"type": "input.done"}))
        while True:
            message = ws.recv(timeout=300)
            if isinstance(message, bytes):
                out["pcm"] += message
                if started is not None:
                    started.set()
                continue
            item = json.loads(message)
            out["messages"].append(item)
            if item["type"] == "audio.done":
                return out


def same_audio(a: bytes, b: bytes) -> bool:
    """Equal up to the codec's float rounding when batched with other streams (~1 LSB)."""
    x, y = np.frombuffer(a, "<i2").astype(int), np.frombuffer(b, "<i2").astype(int)
    return x.size == y.size > 0 and np.abs(x - y).max() <= 64 and np.abs(x - y).mean() < 2


def test_poisoned_requests_beside_running_streams_hurt_none_of_them(live_server, tts_service):
    url = live_server.url
    wait_idle(tts_service)
    alone = {"audio": http_stream(url, 1, sse=False), "sse": http_stream(url, 2, sse=True),
             "ws": ws_stream(url, 3)}
    errors_before = tts_service.engine_stats().finished.get("error", 0)

    results: dict[str, dict] = {}
    started = {name: threading.Event() for name in alone}
    runs = {"audio": lambda: http_stream(url, 1, False, started["audio"]),
            "sse": lambda: http_stream(url, 2, True, started["sse"]),
            "ws": lambda: ws_stream(url, 3, started["ws"])}
    threads = [threading.Thread(target=lambda n=n, f=f: results.__setitem__(n, f()), daemon=True)
               for n, f in runs.items()]
    for t in threads:
        t.start()
    assert all(e.wait(120) for e in started.values())

    # 1. out-of-range values: a 400 naming the field and its range, while the streams run
    for fields, param in API_POISONS:
        response = httpx.post(url + "/v1/audio/speech", json={"input": "Hi.", **fields}, timeout=30) \
            if "speed" not in fields else httpx.post(
                url + "/v1/audio/speech", content=b'{"input": "Hi.", "speed": Infinity}',
                headers={"content-type": "application/json"}, timeout=30)
        assert response.status_code == 400, (fields, response.text)
        error = response.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error", error
        assert param in error["message"] and any(ch.isdigit() for ch in error["message"]), error

    # 2. a request that fails inside the engine step, in the same batch as the streams
    prompt = tts_service.family.build_prompt("A poisoned request.", None)
    params = replace(tts_service.sampling_params(SynthesisOptions(seed=9), prompt), constraint=FailsAfter())

    async def poisoned():
        async for _ in tts_service.engine.stream(prompt.token_ids, params):
            pass

    with pytest.raises(RequestFailed, match="poisoned"):
        asyncio.run(poisoned())
    assert all(t.is_alive() for t in threads)  # the poison ran while every stream was in flight

    for t in threads:
        t.join(300)
    assert sorted(results) == ["audio", "sse", "ws"]
    assert results["sse"]["events"][-1]["type"] == "speech.audio.done"
    done = results["ws"]["messages"][-1]
    assert done["cancelled"] is False and done["finish_reason"] in ("stop", "length")
    refused = [m for m in results["ws"]["messages"] if m["type"] == "error"]
    assert len(refused) == 1 and refused[0]["error"]["param"] == "top_k"
    for name in alone:
        assert same_audio(results[name]["pcm"], alone[name]["pcm"]), name
    stats = tts_service.engine_stats()
    assert stats.finished.get("error", 0) == errors_before + 1 and tts_service.fault is None
    assert httpx.get(url + "/ready").status_code == 200
    wait_idle(tts_service)


def test_range_errors_name_the_allowed_range(live_server):
    response = httpx.post(live_server.url + "/v1/audio/speech", content=b'{"input": "Hi.", "speed": NaN}',
                          headers={"content-type": "application/json"})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "speed"
    assert "between 0.25 and 4.0" in error["message"] and "less than" not in error["message"], error
    response = httpx.post(live_server.url + "/v1/audio/speech", json={"input": "Hi.", "top_k": 2**63})
    assert "between 0 and 1000000" in response.json()["error"]["message"]
    vocab = httpx.post(live_server.url + "/v1/audio/speech", json={"input": "Hi.", "top_k": 999_999})
    assert vocab.status_code == 400 and "0.." in vocab.json()["error"]["message"]
    gamma = httpx.get(live_server.url + "/v1/models").json()["data"][0]["pcgtts"]["num_speculative_tokens"]
    over = httpx.post(live_server.url + "/v1/audio/speech",
                      json={"input": "Hi.", "num_speculative_tokens": gamma + 1})
    assert over.status_code == 400 and f"1..{gamma}" in over.json()["error"]["message"]


def test_a_client_leaving_mid_stream_leaves_the_other_streams_as_they_were(live_server, tts_service):
    """A client that disconnects mid-stream is aborted (its KV freed, its cache rows given away) while a
    seeded stream that started after it runs in the same batches; that stream's audio is what it is alone."""
    url = live_server.url
    wait_idle(tts_service)
    alone = http_stream(url, 4, sse=False)
    # the server's count, not the engine's: a client may leave between two sentences, with no engine
    # request running to abort
    aborted_before = metric(url, "pcgtts:requests_total", status="aborted")
    leaver_started, leave = threading.Event(), threading.Event()

    def leaver():
        body = {"input": TEXT * 2, "response_format": "pcm", "seed": 5}
        with httpx.stream("POST", url + "/v1/audio/speech", json=body, timeout=120) as response:
            for _ in response.iter_bytes():  # keep reading (a client that stops reading is not pulled)
                leaver_started.set()
                if leave.is_set():
                    return  # leaving the block drops the connection mid-stream

    result: dict = {}
    started = threading.Event()
    other = threading.Thread(target=lambda: result.update(http_stream(url, 4, False, started)), daemon=True)
    threads = [threading.Thread(target=leaver, daemon=True), other]
    threads[0].start()
    assert leaver_started.wait(120)
    threads[1].start()
    assert started.wait(120)
    leave.set()
    threads[0].join(60)
    assert not threads[0].is_alive() and threads[1].is_alive()  # it left while the other stream ran
    threads[1].join(300)
    assert same_audio(result["pcm"], alone["pcm"])
    wait_idle(tts_service)  # nothing left running, KV freed
    wait_until(lambda: metric(url, "pcgtts:requests_total", status="aborted") == aborted_before + 1,
               "the client that left was not counted as aborted")
