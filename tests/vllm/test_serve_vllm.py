"""`pcgtts serve --engine vllm`: a random Llasa-shaped checkpoint (1-layer draft, PCG over an ASG table of
speech-token pairs) and a reduced X-codec2, served through vLLM's CPU build in process, to the official
`openai` client: a voice upload through the real encoder, streamed audio in that voice, an aborted stream
whose request vLLM drops (nothing left running, no KV in use), acceptance counters rising on our /metrics
under our names, and /v1/models naming the engine. The demo family, whose decode constraint depends on the
tokens before each position, is refused with the reason."""

from __future__ import annotations

import time

import httpx
import numpy as np
import openai
import pytest
from engine_support import save_draft_from, save_tiny_llama
from pcgtts.engine.speech.llasa import NUM_CODES, SPEECH_OFFSET, VOCAB_SIZE
from pcgtts.engine.speech.llasa_synthetic import save_llasa_tokenizer
from pcgtts.server.audio.formats import OUTPUT_SAMPLE_RATE
from server_support import serve_process, tone
from vllm_support import TINY, require_vllm
from xcodec2_support import build_codec_dirs, require_xcodec2

RATE = 16000


@pytest.fixture(scope="module")
def llasa_vllm(tmp_path_factory):
    """-> (checkpoint, draft, ASG table, codec dir, semantic model dir, empty HF home)."""
    require_vllm()
    require_xcodec2()
    from pcgtts.asg_tables import ASGTable

    root = tmp_path_factory.mktemp("llasa-vllm")
    target = save_tiny_llama(root / "Llasa-tiny", vocab=VOCAB_SIZE, layers=2, tie=True, seed=51, init_std=0.2,
                             **TINY)
    save_llasa_tokenizer(target)
    draft = save_draft_from(target, root / "draft", layers=1)
    pairs = [[t, t + 1] for t in range(SPEECH_OFFSET, SPEECH_OFFSET + NUM_CODES, 2)]
    ASGTable.from_groups(pairs, VOCAB_SIZE).save(root / "pairs.safetensors")
    codec_dir, semantic_dir = build_codec_dirs(root)
    (root / "hf-home").mkdir()
    return target, draft, root / "pairs.safetensors", codec_dir, semantic_dir, root / "hf-home"


def metric(url: str, name: str, **labels) -> float:
    """One sample of our /metrics (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(f"pcgtts:{name}{{") and want in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_for(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def wav_upload(seconds: float) -> bytes:
    import io

    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, tone(seconds, rate=RATE), RATE, format="WAV")
    return buf.getvalue()


def test_serve_llasa_through_vllm(llasa_vllm, tmp_path):
    target, draft, table, codec_dir, semantic_dir, hf_home = llasa_vllm
    env = {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "PCGTTS_DATA_DIR": str(tmp_path),
           "PCGTTS_LOG_LEVEL": "warning", "VLLM_LOGGING_LEVEL": "WARNING", "PCGTTS_MAX_TOKENS": "40"}
    args = ["--engine", "vllm", "--model", str(target), "--draft", str(draft), "--codec", str(codec_dir),
            "--semantic-model", str(semantic_dir), "--acceptance", "pcg", "--asg-table", str(table),
            "--num-speculative-tokens", "3"]
    with serve_process(env, args, ready_timeout=600) as url:
        card = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["pcgtts"]
        assert card["engine"] == "vllm" and card["acceptance"] == "pcg" and card["asg_table"] == "pairs"

        client = openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0, timeout=300)
        voice = client.audio.voices.create(audio_sample=("ref.wav", wav_upload(1.5), "audio/wav"), name="ref",
                                           consent="-", extra_body={"transcript": "hello"})
        assert voice.name == "ref"
        with client.audio.speech.with_streaming_response.create(
                model="tts-1", voice="ref", input="hello world", response_format="pcm",
                extra_body={"temperature": 0.8}) as response:
            pcm = b"".join(response.iter_bytes())
        samples = np.frombuffer(pcm, dtype="<i2")
        assert samples.size > OUTPUT_SAMPLE_RATE // 10 and np.abs(samples).max() > 0

        drafted = metric(url, "spec_decode_num_draft_tokens_total")
        accepted = metric(url, "spec_decode_num_accepted_tokens_total")
        assert drafted > 0 and 0 < accepted <= drafted, (drafted, accepted)
        print(f"vLLM + PCG on the Llasa-shaped model: {accepted:.0f} of {drafted:.0f} drafts accepted")
        assert sum(metric(url, "spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
                   for i in range(3)) == accepted
        # a second request: the counters rise (exact chosen for it: vLLM's own sampler, same names)
        client.audio.speech.create(model="tts-1", voice="ref", input="hello again", response_format="wav",
                                   extra_body={"acceptance": "exact", "temperature": 0.8})
        assert metric(url, "spec_decode_num_draft_tokens_total") > drafted
        assert metric(url, "spec_decode_num_accepted_tokens_total") >= accepted

        # a client that goes away: vLLM drops its request and its KV blocks
        generated = metric(url, "generation_tokens_total")
        with httpx.stream("POST", url + "/v1/audio/speech", timeout=300,
                          json={"model": "tts-1", "voice": "ref", "input": "a long one",
                                "response_format": "pcm", "max_tokens": 60000}) as response:
            assert response.status_code == 200
            next(response.iter_bytes())
        wait_for(lambda: metric(url, "num_requests_running") == 0 and metric(url, "kv_cache_usage_perc") == 0,
                 "vLLM to drop the aborted request")
        assert metric(url, "generation_tokens_total") - generated < 60000
        assert metric(url, "request_success_total", finished_reason="abort") >= 1

        # bad input still gets our error shape, before anything reaches vLLM
        with pytest.raises(openai.BadRequestError) as info:
            client.audio.speech.create(model="tts-1", voice="ref", input="x", extra_body={
                "num_speculative_tokens": 2})
        assert info.value.param == "num_speculative_tokens" and "fixed at 3" in info.value.message


def test_the_demo_family_is_refused_on_vllm(demo_bundle):
    require_vllm()
    from pcgtts.tts import TTSConfig, TTSService

    with pytest.raises(ValueError, match=r"demo-phoneme family .*--engine builtin"):
        TTSService.load(TTSConfig(model_dir=demo_bundle, engine="vllm"))
