"""What the server says is what it does, everywhere alike: the model's real limits in /openapi.json and
/v1/models, enforced at those very bounds; sample rates named unambiguously; one name for the default ASG
table; one temperature rule; voices resolved the way their names are made unique; the conventional status
for each refusal; upload errors in plain words."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR
from safetensors import safe_open
from server_support import tone
from websockets.sync.client import connect

ROOT = Path(__file__).resolve().parents[2]
SPEAK = {"input": "Hi there.", "response_format": "pcm", "seed": 3}
TEMPERATURE_RULE = "0 (greedy) or a finite number between 0.01 and 2"  # one wording, everywhere


def recorded_name(table: Path) -> str:
    """The name an ASG table's build wrote into its header, else the file's stem."""
    with safe_open(str(table), framework="pt") as f:
        return json.loads((f.metadata() or {}).get("meta", "{}")).get("name") or Path(table).stem


@pytest.fixture(scope="module")
def card(live_server) -> dict:
    return httpx.get(live_server.url + "/v1/models").json()["data"][0]["pcgtts"]


@pytest.fixture(scope="module")
def client(live_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_server.url + "/v1", api_key="-", max_retries=0, timeout=120)


def speak(live_server, **fields) -> httpx.Response:
    return httpx.post(live_server.url + "/v1/audio/speech", json={**SPEAK, **fields}, timeout=120)


def test_models_names_the_codec_rate_and_the_output_rate(live_server, card):
    service = live_server.state.service
    assert "sample_rate" not in card  # which one? nobody has to guess
    assert card["codec_sample_rate"] == service.sample_rate
    assert card["output_sample_rate"] == 24000 and card["output_sample_rates"]["ulaw"] == 8000
    wav = speak(live_server, response_format="wav", stream=False).content
    assert sf.info(io.BytesIO(wav)).samplerate == card["output_sample_rate"]


def test_the_default_asg_table_has_one_name_everywhere(live_server, card, demo_bundle):
    bundle_table = live_server.state.service.engine.config.asg_table
    name = recorded_name(bundle_table)
    assert card["asg_table"] == name == card["asg_tables"][0]  # what the playground's menus list first
    assert speak(live_server, acceptance="pcg", asg_table=name).status_code == 200
    if Path(demo_bundle) == DEFAULT_MODEL_DIR:  # the README describes the embedded model
        readme = (ROOT / "README.md").read_text()
        assert f"default ASG table `{name}`" in readme and name == "mel-0.35"


def test_one_temperature_rule_in_errors_models_schema_and_readme(live_server, card):
    for bad in (5.0, 0.005, -1):
        error = speak(live_server, temperature=bad).json()["error"]
        assert error["param"] == "temperature"
        rule = f"Invalid value for 'temperature': must be {TEMPERATURE_RULE}; got {bad!r}."
        assert error["message"] == rule
    assert card["limits"]["temperature"]["rule"] == TEMPERATURE_RULE
    schema = httpx.get(live_server.url + "/openapi.json").json()
    assert TEMPERATURE_RULE in schema["components"]["schemas"]["SpeechRequest"]["properties"]["temperature"][
        "description"]
    assert f"`temperature` {TEMPERATURE_RULE}" in (ROOT / "README.md").read_text()
    for good in (0, 0.01, 2):
        assert speak(live_server, temperature=good, max_tokens=8).status_code == 200, good


def test_the_schema_and_models_publish_the_limits_the_server_enforces(live_server, card):
    """top_k up to the vocabulary, num_speculative_tokens up to γ, max_tokens from the fewest tokens that
    make audio: published alike in /openapi.json and /v1/models, accepted at the bound, refused past it."""
    service = live_server.state.service
    props = httpx.get(live_server.url + "/openapi.json").json()["components"]["schemas"]["SpeechRequest"][
        "properties"]
    bounds = {name: next(b for b in props[name]["anyOf"] if b.get("type") != "null")
              for name in ("top_k", "num_speculative_tokens", "max_tokens")}
    assert bounds["top_k"]["maximum"] == card["limits"]["top_k"]["maximum"] == service.engine.vocab_size
    gamma = bounds["num_speculative_tokens"]["maximum"]
    assert gamma == card["limits"]["num_speculative_tokens"]["maximum"] == card["num_speculative_tokens"] >= 1
    smallest = bounds["max_tokens"]["minimum"]
    assert smallest == card["limits"]["max_tokens"]["minimum"] == service.family.tokens_before_audio + 1
    rules = next(b for b in props["acceptance"]["anyOf"] if b.get("type") != "null")["enum"]
    tables = next(b for b in props["asg_table"]["anyOf"] if b.get("type") != "null")["enum"]
    assert set(card["acceptance_rules"]) <= set(rules) and tables == card["asg_tables"]

    at_bounds = speak(live_server, top_k=bounds["top_k"]["maximum"], max_tokens=smallest,
                      num_speculative_tokens=bounds["num_speculative_tokens"]["maximum"])
    assert at_bounds.status_code == 200 and len(at_bounds.content) > 0  # the fewest tokens still speak
    for name, past in (("top_k", bounds["top_k"]["maximum"] + 1),
                       ("num_speculative_tokens", bounds["num_speculative_tokens"]["maximum"] + 1),
                       ("max_tokens", smallest - 1)):
        refused = speak(live_server, **{name: past})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == name, (name, refused.text)
    too_few = speak(live_server, max_tokens=smallest - 1).json()["error"]["message"]
    assert f"at least {smallest}" in too_few  # names the smallest value that makes audio


def test_voice_names_resolve_ignoring_case_as_they_are_made_unique(live_server, client):
    preset = httpx.get(live_server.url + "/v1/audio/voices").json()["data"][0]["name"]
    audio = {voice: speak(live_server, voice=voice, max_tokens=30).content
             for voice in (preset, preset.upper(), preset.title())}
    assert len(set(audio.values())) == 1 and len(audio[preset]) > 0  # the same voice, the same seed
    assert httpx.get(live_server.url + f"/v1/audio/voices/{preset.upper()}").json()["name"] == preset
    buf = io.BytesIO()
    sf.write(buf, tone(1.5), 22050, format="WAV")
    created = httpx.post(live_server.url + "/v1/audio/voices", timeout=60,
                         data={"name": "Mixed Case", "transcript": "a clip"},
                         files={"audio_sample": ("a.wav", buf.getvalue())}).json()
    try:
        for voice in ("mixed case", "MIXED CASE", {"id": created["id"]}):
            assert speak(live_server, voice=voice, max_tokens=30).content == \
                speak(live_server, voice="Mixed Case", max_tokens=30).content
    finally:
        httpx.delete(live_server.url + f"/v1/audio/voices/{created['id']}")


@pytest.mark.parametrize("voice", [{"id": "voice_0123456789abcdef"}, "nobody-by-that-name"])
def test_an_unknown_voice_is_not_found(client, voice):
    """404, as GET /v1/audio/voices/{id} answers for the same voice."""
    with pytest.raises(openai.NotFoundError) as info:
        client.audio.speech.create(model="tts-1", voice=voice, input="Hi.")
    assert info.value.code == "voice_not_found"
    assert info.value.param == ("voice.id" if isinstance(voice, dict) else "voice")


def test_deleting_a_preset_is_forbidden_with_a_reason(live_server, client):
    preset = httpx.get(live_server.url + "/v1/audio/voices").json()["data"][0]["name"]
    for name in (preset, preset.upper()):
        with pytest.raises(openai.PermissionDeniedError) as info:
            client.audio.voices.delete(name)
        assert info.value.status_code == 403 and info.value.code == "preset_voice"
        assert "presets cannot be deleted" in info.value.message
    assert preset in httpx.get(live_server.url + "/v1/audio/voices").json()["voices"]


@pytest.mark.parametrize("data", [b"definitely not audio " * 64, b"\x1a\x45\xdf\xa3" + bytes(400),
                                  b"RIFF\x10\x00\x00\x00WAVEjunk" + bytes(200)])
def test_an_upload_that_is_not_audio_gets_a_plain_message(live_server, data):
    response = httpx.post(live_server.url + "/v1/audio/voices", timeout=60,
                          data={"name": "not-audio", "transcript": "words"},
                          files={"audio_sample": ("clip.wav", data)})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "unsupported_audio_format" and error["param"] == "audio_sample"
    assert error["message"] == ("audio_sample: not audio in a format this server reads; send WAV, FLAC, MP3 "
                                "or OGG audio.")
    assert not re.search(r"Errno|Invalid data|<none>|libsndfile|ffmpeg", error["message"])


def test_inline_reference_audio_that_is_not_audio_gets_the_same_plain_message(live_server):
    import base64

    error = speak(live_server, ref_audio=base64.b64encode(b"not audio at all " * 40).decode(),
                  ref_text="words").json()["error"]
    assert error["param"] == "ref_audio" and "WAV, FLAC, MP3 or OGG" in error["message"]
    assert "Errno" not in error["message"]


def test_websocket_input_done_with_nothing_pending_answers_an_error(live_server):
    from pcgtts.server.routes.ws import PROTOCOL

    assert "With no text pending" in PROTOCOL and "`empty_input`" in PROTOCOL
    with connect(live_server.url.replace("http://", "ws://") + "/v1/audio/speech/stream") as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
        for pending in ([], ["   "]):
            for text in pending:
                ws.send(json.dumps({"type": "input.text", "text": text}))
            ws.send(json.dumps({"type": "input.done"}))
            event = json.loads(ws.recv(timeout=10))
            assert event["type"] == "error" and "utterance_id" not in event, event
            assert event["error"]["code"] == "empty_input"
        ws.send(json.dumps({"type": "session.config", "max_tokens": 20, "seed": 1}))
        ws.send(json.dumps({"type": "input.text", "text": "Still here."}))
        ws.send(json.dumps({"type": "input.done"}))  # the session goes on
        kinds = []
        while "audio.done" not in kinds:
            message = ws.recv(timeout=60)
            kinds.append("binary" if isinstance(message, bytes) else json.loads(message)["type"])
        assert kinds[0] == "audio.start" and "binary" in kinds


def test_the_favicon_is_served(live_server):
    icon = httpx.get(live_server.url + "/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"] == "image/x-icon"
    assert icon.content[:4] == b"\x00\x00\x01\x00" and b"PNG" in icon.content[:64]
    assert '<link rel="icon" href="/favicon.ico"' in httpx.get(live_server.url + "/").text


def test_numbers_in_the_models_limits_are_the_servers(live_server, card):
    """Every numeric limit /v1/models lists is enforced: its minimum and maximum are accepted by validation
    (a request at the bound gets past the 400s), one step past either is a 400 naming the option."""
    step = {"temperature": 0.5, "top_p": 0.001, "repetition_penalty": 0.01, "speed": 0.01, "seed": 1,
            "top_k": 1, "max_tokens": 1, "num_speculative_tokens": 1}
    for name, limit in card["limits"].items():
        if limit is None or "minimum" not in limit or name not in step:
            continue
        low, high = limit["minimum"], limit["maximum"]
        for value, ok in ((low, True), (high, True), (low - step[name], False), (high + step[name], False)):
            if name == "temperature" and value == low - step[name]:
                value = -step[name]
            fields = {name: value, "max_tokens": 4} if name != "max_tokens" else {name: value}
            if name == "speed":
                fields["max_tokens"] = 4
            status = speak(live_server, **fields).status_code
            assert (status == 200) is ok, (name, value, status)
    assert np.isfinite(card["limits"]["seed"]["maximum"])
