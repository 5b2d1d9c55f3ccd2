"""`pcgtts serve` with a random Llasa-shaped checkpoint and a random X-codec2 (the real xcodec2 classes,
reduced sizes), offline: the official `openai` client uploads a voice (through the real encoder and semantic
model) and gets streamed audio; a decode-only server (no semantic model) speaks preset codes and answers
uploads with a clear 501."""

from __future__ import annotations

import io
import json
import struct

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from engine_support import save_draft_from, save_tiny_llama
from pcgtts.engine.speech.llasa import VOCAB_SIZE
from pcgtts.engine.speech.llasa_synthetic import save_llasa_tokenizer
from pcgtts.server.audio.formats import OUTPUT_SAMPLE_RATE
from pcgtts.tts.bundle import MANIFEST
from server_support import serve_process, tone
from xcodec2_support import build_codec_dirs, require_xcodec2

HOP, RATE = 320, 16000


@pytest.fixture(scope="module")
def llasa_setup(tmp_path_factory):
    """-> (Llasa-shaped checkpoint, its draft, codec dir, semantic model dir, empty HF home)."""
    require_xcodec2()
    root = tmp_path_factory.mktemp("llasa-serve")
    target = save_tiny_llama(root / "Llasa-tiny", vocab=VOCAB_SIZE, hidden=32, heads=2, kv_heads=1,
                             intermediate=64, layers=2, tie=True, seed=51, init_std=0.2)
    save_llasa_tokenizer(target)
    draft = save_draft_from(target, root / "draft", layers=1)
    codec_dir, semantic_dir = build_codec_dirs(root)
    (root / "hf-home").mkdir()
    return target, draft, codec_dir, semantic_dir, root / "hf-home"


def offline_env(hf_home, data_dir) -> dict[str, str]:
    return {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "PCGTTS_SEMANTIC_MODEL": "",
            "PCGTTS_DATA_DIR": str(data_dir), "PCGTTS_LOG_LEVEL": "warning", "PCGTTS_MAX_TOKENS": "40"}


def wav_bytes(audio: np.ndarray, rate: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, audio, rate, format="WAV")
    return buf.getvalue()


def streamed_wav(client: openai.OpenAI, voice: str) -> tuple[int, np.ndarray, int]:
    """-> (sample rate, int16 samples, chunks received) of one streamed speech request."""
    with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice=voice, input="hello world", response_format="wav") as response:
        chunks = [c for c in response.iter_bytes() if c]
    data = b"".join(chunks)
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE"
    rate = struct.unpack("<I", data[24:28])[0]
    return rate, np.frombuffer(data[44:], dtype="<i2"), len(chunks)


def test_serve_llasa_with_xcodec2_to_the_openai_client(llasa_setup, tmp_path):
    target, draft, codec_dir, semantic_dir, hf_home = llasa_setup
    args = ["--model", str(target), "--draft", str(draft), "--codec", str(codec_dir), "--semantic-model",
            str(semantic_dir), "--acceptance", "exact", "--num-speculative-tokens", "3"]
    with serve_process(offline_env(hf_home, tmp_path), args) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0, timeout=300)
        clip = tone(1.5, rate=RATE)
        voice = client.audio.voices.create(audio_sample=("ref.wav", wav_bytes(clip, RATE), "audio/wav"),
                                           name="ref", consent="-", extra_body={"transcript": "hello"})
        codes = [np.load(p) for p in (tmp_path / "voices" / "codes").glob(f"{voice.id}--xcodec2-*.npy")]
        assert len(codes) == 1, "the upload's codes were not stored"
        assert codes[0].shape == (clip.size // HOP + 1,)  # the real encoder: 50 codes per second
        assert codes[0].min() >= 0 and codes[0].max() < 65536 and len(set(codes[0].tolist())) > 5
        rate, samples, _ = streamed_wav(client, "ref")
        assert rate == OUTPUT_SAMPLE_RATE and samples.size > 0 and np.abs(samples).max() > 0
        # Llasa cannot say where its words are: /v1/models says so and asking for timings gets none
        assert httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["pcgtts"]["word_timings"] is False
        body = {"model": "tts-1", "voice": "ref", "input": "hello world", "response_format": "pcm",
                "stream_format": "sse", "word_timings": True}
        with httpx.stream("POST", url + "/v1/audio/speech", json=body, timeout=300) as response:
            lines = [line for line in response.iter_lines() if line.startswith("data: ")]
        kinds = [json.loads(line[6:])["type"] for line in lines]
        assert kinds[-1] == "speech.audio.done" and set(kinds) == {"speech.audio.delta", "speech.audio.done"}


def test_decode_only_server_speaks_presets_and_refuses_uploads(llasa_setup, tmp_path):
    """No semantic model given and none in the (empty) Hugging Face cache: preset voices with stored
    codes still speak; an upload gets a 501 naming what is missing."""
    target, _, codec_dir, _, hf_home = llasa_setup
    bundle = tmp_path / "bundle"
    (bundle / "voices").mkdir(parents=True)
    codes = np.random.default_rng(5).integers(0, 65536, size=50).tolist()
    (bundle / "voices" / "preset.json").write_text(json.dumps({"codes": codes, "transcript": "hello"}))
    manifest = {"family": "llasa", "codec_type": "xcodec2", "target": str(target), "codec": str(codec_dir),
                "voices": "voices"}
    (bundle / MANIFEST).write_text(json.dumps(manifest))
    with serve_process(offline_env(hf_home, tmp_path / "data"), ["--model", str(bundle)]) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0, timeout=300)
        rate, samples, _ = streamed_wav(client, "preset")
        assert rate == OUTPUT_SAMPLE_RATE and samples.size > 0
        with pytest.raises(openai.InternalServerError) as info:
            client.audio.voices.create(audio_sample=("ref.wav", wav_bytes(tone(1.5, rate=RATE), RATE)),
                                       name="ref", consent="-", extra_body={"transcript": "hello"})
        assert info.value.status_code == 501 and info.value.code == "voice_encoding_unavailable"
        assert "w2v-bert-2.0" in info.value.message and "--semantic-model" in info.value.message
