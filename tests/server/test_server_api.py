"""The speech API through the official `openai` client against a real server on a loopback port."""

from __future__ import annotations

import base64
import io
import json

import av
import httpx
import numpy as np
import openai
import pytest

TEXT = "Hello there, friend."
SEED = {"seed": 11}
CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/opus", "aac": "audio/aac", "flac": "audio/flac",
                 "wav": "audio/wav", "pcm": "audio/pcm", "ulaw": "audio/basic", "alaw": "audio/x-alaw-basic"}


@pytest.fixture(scope="module")
def client(live_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def reference_pcm(client) -> np.ndarray:
    """The utterance as raw 24 kHz PCM; every other format must decode to the same length."""
    data = client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format="pcm",
                                      extra_body=SEED).read()
    assert len(data) % 2 == 0
    return np.frombuffer(data, "<i2")


def decoded_seconds(fmt: str, data: bytes) -> float:
    if fmt == "pcm":
        return len(data) / 2 / 24000
    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(audio=0))
        rate = container.streams.audio[0].codec_context.sample_rate
    assert rate in (24000, 48000)  # Opus decoders run at 48 kHz; the stream says 24 kHz
    return sum(f.samples for f in frames) / rate


def test_health_ready_and_models(live_server):
    assert httpx.get(live_server.url + "/health").json() == {"status": "ok"}
    ready = httpx.get(live_server.url + "/ready")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    models = httpx.get(live_server.url + "/v1/models").json()
    card = models["data"][0]
    assert models["object"] == "list" and card["object"] == "model"
    assert card["pcgtts"]["codec_sample_rate"] == live_server.state.service.sample_rate
    assert card["pcgtts"]["output_sample_rate"] == 24000
    assert "exact" in card["pcgtts"]["acceptance_rules"]
    audio_models = httpx.get(live_server.url + "/v1/audio/models").json()["models"]
    assert {"id": card["id"]} in audio_models and {"id": "tts-1"} in audio_models


def test_ab_choices_listed_by_models_are_accepted(client, live_server):
    """What GET /v1/models offers for A/B tests (rules, ASG tables, draft lengths up to γ) is served."""
    card = httpx.get(live_server.url + "/v1/models").json()["data"][0]["pcgtts"]
    assert card["asg_tables"] and card["num_speculative_tokens"] >= 1
    assert card["sampling_defaults"] == live_server.state.service.bundle.sampling
    for table in card["asg_tables"]:
        choice = {"acceptance": "pcg", "asg_table": table, "num_speculative_tokens": 1, "seed": 2}
        audio = client.audio.speech.create(model="tts-1", voice="alloy", input="Try this.",
                                           response_format="pcm", extra_body=choice).read()
        assert len(audio) > 2 * 24000 * 0.2  # at least 0.2 s of 16-bit PCM


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav", "pcm"])
def test_every_format_create_and_streaming_response(client, reference_pcm, fmt):
    expected = reference_pcm.size / 24000
    assert expected > 0.2
    whole = client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format=fmt,
                                       extra_body=SEED)
    assert whole.response.headers["content-type"].startswith(CONTENT_TYPES[fmt])
    with client.audio.speech.with_streaming_response.create(model="tts-1", voice="alloy", input=TEXT,
                                                            response_format=fmt, extra_body=SEED) as response:
        assert response.headers["content-type"].startswith(CONTENT_TYPES[fmt])
        assert response.headers.get("transfer-encoding") == "chunked"
        streamed = b"".join(response.iter_bytes())
    for data in (whole.read(), streamed):
        seconds = decoded_seconds(fmt, data)
        # Same seed, same audio; lossy encoders add < 0.1 s of priming/padding.
        assert expected - 0.001 <= seconds <= expected + 0.1, (fmt, seconds, expected)
    if fmt in ("pcm", "wav", "flac"):  # lossless: the same samples (a whole file's header holds the length)
        assert samples_of(fmt, streamed).tobytes() == samples_of(fmt, whole.read()).tobytes()


def samples_of(fmt: str, data: bytes) -> np.ndarray:
    """The 16-bit samples of a lossless response, streamed or whole."""
    if fmt == "pcm":
        return np.frombuffer(data, "<i2")
    if fmt == "wav":
        return np.frombuffer(data[44:], "<i2")
    with av.open(io.BytesIO(data)) as container:  # libsndfile cannot read a streamed FLAC; ffmpeg can
        decoded = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])
    assert decoded.dtype == np.int16
    return decoded


@pytest.mark.parametrize(("fmt", "demuxer"), [("ulaw", "mulaw"), ("alaw", "alaw")])
def test_telephony_formats_are_8khz_g711(client, reference_pcm, fmt, demuxer):
    """ulaw/alaw (extensions for telephony): headerless G.711 at 8 kHz, the same speech as the PCM."""
    import soxr

    with client.audio.speech.with_streaming_response.create(model="tts-1", voice="alloy", input=TEXT,
                                                            response_format=fmt, extra_body=SEED) as response:
        assert response.headers["content-type"] == CONTENT_TYPES[fmt]
        data = b"".join(response.iter_bytes())
    with av.open(io.BytesIO(data), format=demuxer, options={"sample_rate": "8000"}) as container:
        decoded = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])
    decoded = decoded.astype(np.float32) / (32768 if decoded.dtype == np.int16 else 1)
    pcm_8k = soxr.resample(reference_pcm.astype(np.float32) / 32768, 24000, 8000)
    assert abs(decoded.size - reference_pcm.size / 3) <= 2
    n = min(decoded.size, pcm_8k.size)
    noise = decoded[:n] - pcm_8k[:n]
    snr_db = 10 * np.log10(np.sum(pcm_8k[:n] ** 2) / np.sum(noise ** 2))
    assert snr_db > 25  # G.711 companding noise is ~35-38 dB below speech; resampling paths differ a bit


def test_whole_wav_has_exact_sizes(client, reference_pcm):
    data = client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format="wav",
                                      extra_body={**SEED, "stream": False}).read()
    assert int.from_bytes(data[4:8], "little") == len(data) - 8
    assert int.from_bytes(data[40:44], "little") == len(data) - 44
    assert abs((len(data) - 44) // 2 - reference_pcm.size) <= 1


def test_whole_flac_has_a_complete_streaminfo_that_libsndfile_reads(client, reference_pcm):
    """stream=false FLAC: total samples and MD5 filled in, so soundfile/libsndfile reads it whole."""
    import hashlib

    import soundfile as sf

    response = client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format="flac",
                                          extra_body={**SEED, "stream": False})
    data = response.read()
    assert int(response.response.headers["content-length"]) == len(data)
    info = sf.info(io.BytesIO(data))
    assert info.samplerate == 24000 and abs(info.frames - reference_pcm.size) <= 1
    audio, _ = sf.read(io.BytesIO(data), dtype="int16")
    assert audio.size == info.frames
    assert data[26:42] == hashlib.md5(audio.astype("<i2").tobytes()).digest()  # STREAMINFO's MD5


def test_sse_events(client, reference_pcm):
    with client.audio.speech.with_streaming_response.create(
            model="gpt-4o-mini-tts", voice="alloy", input=TEXT, response_format="pcm", stream_format="sse",
            extra_body=SEED) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        body = response.read().decode()
    events = [json.loads(block[len("data: "):]) for block in body.split("\n\n") if block.strip()]
    assert all(block.startswith("data: ") for block in body.split("\n\n") if block.strip())
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 1 and events[-1]["type"] == "speech.audio.done"
    assert [e["type"] for e in events].count("speech.audio.done") == 1
    pcm = np.frombuffer(b"".join(base64.b64decode(e["audio"]) for e in deltas), "<i2")
    assert np.array_equal(pcm, reference_pcm)
    usage = events[-1]["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_voice_by_preset_name_and_id_object(client, live_server):
    voices = httpx.get(live_server.url + "/v1/audio/voices").json()["data"]
    presets = [v for v in voices if v["kind"] == "preset"]
    assert presets, "the model ships preset voices"
    name = presets[-1]["id"]
    for voice in (name, {"id": name}):
        audio = client.audio.speech.create(model="pcgtts", voice=voice, input="Yes.", response_format="wav",
                                           extra_body=SEED).read()
        assert audio[:4] == b"RIFF" and len(audio) > 44 + 2000


@pytest.mark.parametrize(("body", "param", "code"), [
    ({"input": "x" * 4097}, "input", "string_above_max_length"),
    ({"input": ""}, "input", "string_below_min_length"),
    ({"response_format": "ogg"}, "response_format", "invalid_value"),
    ({"speed": 4.5}, "speed", "decimal_above_max_value"),
    ({"speed": 0.1}, "speed", "decimal_below_min_value"),
    ({"stream_format": "json"}, "stream_format", "invalid_value"),
    ({"temperature": -1}, "temperature", "decimal_below_min_value"),
    ({"acceptance": "magic"}, "acceptance", "invalid_value"),
    ({"asg_table": "not-loaded"}, "asg_table", "invalid_value"),
    ({"num_speculative_tokens": 9}, "num_speculative_tokens", "invalid_value"),
    ({"ref_audio": "AAAA", "ref_text": "hi"}, "ref_audio", "unsupported_audio_format"),
    ({"ref_audio": "%%%", "ref_text": "hi"}, "ref_audio", "invalid_base64"),
    ({"colour": "blue"}, "colour", "unknown_parameter"),
])
def test_bad_requests_raise_bad_request_error(client, body, param, code):
    args = {"model": "tts-1", "voice": "alloy", "input": "Hi.", **body}
    extra = {k: args.pop(k) for k in list(args) if k not in ("model", "voice", "input", "response_format",
                                                               "speed", "stream_format")}
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.speech.create(**args, extra_body=extra)
    err = info.value
    assert err.status_code == 400 and err.type == "invalid_request_error"
    assert err.param == param and err.code == code
    assert set(err.body) == {"message", "type", "param", "code"}


def test_nothing_speakable_is_unprocessable(client):
    with pytest.raises(openai.UnprocessableEntityError) as info:
        client.audio.speech.create(model="tts-1", voice="alloy", input="... !!! ???")
    assert info.value.code == "unprocessable_input" and info.value.param == "input"


def test_not_found_and_malformed_json(client, live_server):
    with pytest.raises(openai.NotFoundError) as info:
        client.get("/audio/voices/voice_nope", cast_to=httpx.Response)
    assert info.value.code == "voice_not_found"
    raw = httpx.post(live_server.url + "/v1/audio/speech", content=b"{not json",
                     headers={"content-type": "application/json"})
    assert raw.status_code == 400 and raw.json()["error"]["code"] == "invalid_json"


def test_openapi_describes_the_api(live_server):
    spec = httpx.get(live_server.url + "/openapi.json").json()
    paths = spec["paths"]
    for path in ("/v1/audio/speech", "/v1/audio/voices", "/v1/audio/voices/{voice_id}", "/v1/models",
                 "/health", "/ready", "/metrics"):
        assert path in paths, path
    body = spec["components"]["schemas"]["SpeechRequest"]["properties"]
    for field in ("model", "input", "voice", "instructions", "response_format", "speed", "stream_format",
                  "ref_audio", "ref_text", "seed", "temperature", "top_p", "top_k", "acceptance"):
        assert field in body, field
    assert body["input"]["maxLength"] == 4096
    assert set(paths["/v1/audio/voices"]) == {"get", "post"}
    assert "delete" in paths["/v1/audio/voices/{voice_id}"]
    speech_responses = paths["/v1/audio/speech"]["post"]["responses"]
    assert {"audio/mpeg", "audio/pcm", "text/event-stream"} <= set(speech_responses["200"]["content"])
    assert {"400", "429", "503"} <= set(speech_responses)
    assert "/v1/audio/speech/stream" in spec["info"]["description"]  # the WebSocket protocol is described
    assert "input.done" in spec["info"]["description"]
    assert httpx.get(live_server.url + "/docs").status_code == 200


def test_metrics_after_traffic(client, live_server):
    """Runs after the requests above: engine counters under vLLM names, audio SLO histograms, no high-
    cardinality labels."""
    from prometheus_client.parser import text_string_to_metric_families

    client.audio.speech.create(model="tts-1", voice="alloy", input="Count me.", response_format="pcm").read()
    client.audio.speech.create(model="tts-1", voice="alloy", input="Me too.", stream_format="sse").read()
    exposition = httpx.get(live_server.url + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(exposition)}

    def value(name: str, suffix: str = "", **labels) -> float:
        return sum(s.value for s in families[name].samples
                   if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()))

    gamma = live_server.state.service.engine_num_speculative_tokens
    for gauge in ("pcgtts:num_requests_running", "pcgtts:num_requests_waiting", "pcgtts:kv_cache_usage_perc"):
        assert families[gauge].type == "gauge"
    assert value("pcgtts:prompt_tokens", "_total") > 0 and value("pcgtts:generation_tokens", "_total") > 0
    drafted = value("pcgtts:spec_decode_num_draft_tokens", "_total")
    accepted = value("pcgtts:spec_decode_num_accepted_tokens", "_total")
    drafts = value("pcgtts:spec_decode_num_drafts", "_total")
    assert drafts <= drafted <= gamma * drafts and drafts > 0 and 0 <= accepted <= drafted  # γ_i in 1..γ
    per_pos = families["pcgtts:spec_decode_num_accepted_tokens_per_pos"].samples
    positions = {s.labels["position"]: s.value for s in per_pos}
    assert sorted(positions) == [str(i) for i in range(gamma)] and sum(positions.values()) == accepted
    assert value("pcgtts:audio_time_to_first_chunk_seconds", "_count") > 0
    # requests report how long their first audio was held (0 when sent at once), none beyond the limit
    held = value("pcgtts:audio_first_chunk_hold_seconds", "_count")
    assert held > 0
    limit = live_server.state.service.config.first_audio_max_hold_s
    assert value("pcgtts:audio_first_chunk_hold_seconds", "_sum") <= held * (limit + 0.5)
    assert value("pcgtts:audio_rtf", "_count") > 0 and value("pcgtts:audio_seconds", "_total") > 0
    assert value("pcgtts:requests", "_total", format="pcm", stream_mode="audio", status="ok") > 0
    assert value("pcgtts:requests", "_total", stream_mode="sse", status="ok") > 0
    assert value("pcgtts:request_success", "_total", finished_reason="stop") > 0
    calls = value("pcgtts:codec_decode_calls", "_total")
    assert 0 < calls <= value("pcgtts:codec_decode_stream_jobs", "_total")  # a call serves >= 1 stream
    assert value("pcgtts:codec_decode_seconds", "_total") > 0
    assert value("pcgtts:codec_process_restarts", "_total") == 0
    queries = value("pcgtts:prefix_cache_queries", "_total")
    assert queries > 0 and 0 < value("pcgtts:prefix_cache_hits", "_total") <= queries  # one preset voice
    assert value("pcgtts:audio_buffer_headroom_seconds", "_count") > 0
    assert value("pcgtts:decode_steps", "_total") > 0
    # the same forwards counted by the draft length they ran
    assert value("pcgtts:decode_steps_by_draft_length", "_total") == value("pcgtts:decode_steps", "_total")
    assert families["pcgtts:audio_streams_active"].type == "gauge"
    labels = {k for f in families.values() for s in f.samples for k in s.labels}
    assert labels <= {"model_name", "position", "format", "stream_mode", "status", "finished_reason", "le",
                      "mode", "draft_length"}
