"""The README's seed promise through the real server: a seeded request's PCM bytes are the same alone and
with a crowd of other requests streaming through the same server, whatever they ask for (text length,
sampling, acceptance rule, γ, ASG table, format, SSE, seeded or not, clients that leave mid-stream), and
whenever they join and leave. Issue 29 found a seeded 4-sentence request that diverged after 10.7 s of
audio beside ~50 such requests."""

from __future__ import annotations

import random
import threading

import httpx
from server_support import wait_idle, wait_until

PROBE = {"input": "The little boat drifted slowly towards the shore. The gulls cried overhead. A quiet "
                  "voice answered from the hall. We met at noon and walked to the market.",
         "seed": 33, "temperature": 0.8, "voice": "aria", "response_format": "pcm"}
TEXTS = ["Yes.", "Please bring the blue folder tomorrow morning.",
         "Seven silver swans swam silently seaward.",
         "How far is it to the old mill by the river? Not far at all, my friend.",
         "Stop! Look both ways before you cross the road, and then walk, do not run."]


def crowd_bodies(n: int) -> list[tuple[dict, int | None]]:
    """(body, bytes after which the client leaves, or None) for n varied requests."""
    rng = random.Random(11)
    out = []
    for _ in range(n):
        body = {"input": rng.choice(TEXTS), "voice": rng.choice(["aria", "bruno", "alloy", "cleo"]),
                "response_format": rng.choice(["pcm", "wav", "mp3", "opus"]),
                "temperature": rng.choice([0.0, 0.5, 1.0, 1.3])}
        for name, values in (("seed", [None, 7, 33]), ("top_k", [None, 5, 60]), ("top_p", [None, 0.8]),
                             ("repetition_penalty", [None, 1.2]), ("num_speculative_tokens", [None, 1, 2]),
                             ("acceptance", [None, "exact", "ssd", "topk", "lantern"]),
                             ("asg_table", [None, "mel-0.4"]), ("max_tokens", [None, 30, 120]),
                             ("stream_format", [None, "sse"]), ("speed", [None, 1.25])):
            value = rng.choice(values)
            if value is not None:
                body[name] = value
        if body.get("stream_format") == "sse":
            body["response_format"] = "pcm"
        out.append((body, rng.choice([None, None, 4000])))
    return out


def speak(url: str, body: dict, leave_after: int | None = None) -> bytes:
    data = b""
    with httpx.stream("POST", url + "/v1/audio/speech", json=body, timeout=300) as response:
        assert response.status_code == 200, response.read()
        for chunk in response.iter_bytes():
            data += chunk
            if leave_after is not None and len(data) >= leave_after:
                break  # the client goes away mid-stream
    return data


def test_a_seeded_requests_audio_is_the_same_alone_and_beside_a_crowd(live_server):
    url, service = live_server.url, live_server.state.service
    wait_idle(service, timeout=120)
    alone = speak(url, PROBE)
    assert len(alone) > 2 * 24000 * 6  # several seconds of 16-bit audio at 24 kHz

    bodies = crowd_bodies(24)
    results: dict[int, bytes] = {}
    errors: list[BaseException] = []

    def client(i: int, body: dict, leave: int | None) -> None:
        try:
            results[i] = speak(url, body, leave)
        except BaseException as exc:  # reported below, in the test's own thread
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i, b, leave)) for i, (b, leave) in enumerate(bodies)]
    for t in threads[:10]:  # a first wave, then the probe while they stream, then more
        t.start()
    wait_until(lambda: service.engine_stats().num_running >= 6, "the first wave is not decoding", 120)
    probe: dict[str, bytes] = {}
    probe_thread = threading.Thread(target=lambda: probe.setdefault("pcm", speak(url, PROBE)))
    probe_thread.start()
    for t in threads[10:]:
        wait_until(lambda: service.engine_stats().num_waiting < 4, "the queue does not drain", 120)
        t.start()
    for t in [*threads, probe_thread]:
        t.join(timeout=600)
    assert not errors, errors
    assert len(results) == len(bodies)
    assert probe["pcm"] == alone
    wait_idle(service, timeout=120)
    assert speak(url, PROBE) == alone  # and alone again, its voice's prefix now cached
