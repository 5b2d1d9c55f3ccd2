"""What the official `openai` SDK writes opens in every common reader: `create(...).write_to_file()` of the
default FLAC and WAV gives complete files (FLAC STREAMINFO with total samples and MD5, WAV sizes exact),
read alike by libsndfile (`soundfile`), Python's `wave` and ffprobe; a client that reads a stream
(`with_streaming_response`, `"stream": true`) still gets one, and the formats whose streamed bytes are
already whole files stream by default."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import wave
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from system_support import require_program

TEXT = "Files that open everywhere."
SEED = {"seed": 5}


@pytest.fixture(scope="module")
def client(live_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def written(client, tmp_path_factory) -> dict[str, Path]:
    """The default request's files, as the SDK writes them: nothing set but the format."""
    folder = tmp_path_factory.mktemp("sdk-files")
    files = {}
    for fmt in ("flac", "wav"):
        files[fmt] = folder / f"speech.{fmt}"
        client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format=fmt,
                                   extra_body=SEED).write_to_file(files[fmt])
    return files


@pytest.fixture(scope="module")
def samples(client) -> np.ndarray:
    """The same utterance as raw PCM (16-bit samples at 24 kHz)."""
    pcm = client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format="pcm",
                                     extra_body={**SEED, "stream": False}).read()
    return np.frombuffer(pcm, "<i2")


def _streaminfo(flac: bytes) -> tuple[int, bytes]:
    """(total samples, MD5 of the decoded audio) from FLAC's STREAMINFO, the first metadata block."""
    assert flac[:4] == b"fLaC" and flac[4] & 0x7F == 0
    return int.from_bytes(flac[18:26], "big") & ((1 << 36) - 1), flac[26:42]


@pytest.mark.parametrize("fmt", ["flac", "wav"])
def test_soundfile_reads_the_default_file_whole(written, samples, fmt):
    info = sf.info(written[fmt])
    audio, rate = sf.read(written[fmt], dtype="int16")
    assert rate == info.samplerate == 24000 and info.channels == 1
    assert info.frames == audio.size == samples.size
    np.testing.assert_array_equal(audio, samples)
    if fmt == "flac":
        total, md5 = _streaminfo(written[fmt].read_bytes())
        assert total == samples.size and md5 == hashlib.md5(samples.tobytes()).digest()


def test_pythons_wave_counts_the_default_wav_exactly(written, samples):
    with wave.open(str(written["wav"])) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
        assert w.getnframes() == samples.size
        assert w.readframes(w.getnframes()) == samples.tobytes()


@pytest.mark.parametrize("fmt", ["flac", "wav"])
def test_ffprobe_reads_the_default_files_duration_without_a_warning(written, samples, fmt):
    ffprobe = require_program("ffprobe")
    done = subprocess.run([ffprobe, "-v", "warning", "-show_entries", "stream=duration_ts,sample_rate",
                           "-of", "json", str(written[fmt])], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr  # no "file may be invalid"
    stream = json.loads(done.stdout)["streams"][0]
    assert int(stream["sample_rate"]) == 24000 and int(stream["duration_ts"]) == samples.size


@pytest.mark.parametrize("fmt", ["flac", "wav"])
def test_a_client_that_reads_a_stream_still_gets_one(client, live_server, fmt):
    """with_streaming_response (the SDK says so in its request) and "stream": true stream: chunked, the
    length left unknown in the header; a plain HTTP client that says nothing gets the whole file."""
    with client.audio.speech.with_streaming_response.create(model="tts-1", voice="alloy", input=TEXT,
                                                            response_format=fmt, extra_body=SEED) as response:
        assert response.headers.get("transfer-encoding") == "chunked"
        assert "content-length" not in response.headers
        streamed = b"".join(response.iter_bytes())
    asked = client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format=fmt,
                                       extra_body={**SEED, "stream": True})
    assert asked.response.headers.get("transfer-encoding") == "chunked"
    for data in (streamed, asked.read()):
        if fmt == "flac":
            assert _streaminfo(data)[0] == 0  # "unknown": its header left before the end was known
        else:
            assert int.from_bytes(data[40:44], "little") == 0xFFFFFFFF
    plain = httpx.post(live_server.url + "/v1/audio/speech", timeout=120,
                       json={"input": TEXT, "voice": "alloy", "response_format": fmt, **SEED})
    assert int(plain.headers["content-length"]) == len(plain.content)
    assert sf.info(io.BytesIO(plain.content)).frames == sf.read(io.BytesIO(plain.content))[0].size


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "pcm"])
def test_formats_whose_stream_is_a_whole_file_stream_by_default(live_server, fmt):
    with httpx.stream("POST", live_server.url + "/v1/audio/speech", timeout=120,
                      json={"input": TEXT, "voice": "alloy", "response_format": fmt, **SEED}) as response:
        assert response.status_code == 200
        assert response.headers.get("transfer-encoding") == "chunked"
        assert sum(len(chunk) for chunk in response.iter_bytes()) > 0
