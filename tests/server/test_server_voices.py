"""Voices over HTTP: upload, list, use, delete, persistence across a server restart, bad uploads."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from pcgtts.server.settings import ServerSettings
from pcgtts.tts import TTSConfig, TTSService
from server_support import LiveServer, free_port, tone

MAX_UPLOAD_MB = 1.0


def wav_bytes(audio: np.ndarray, rate: int = 22050, fmt: str = "WAV", subtype: str | None = None) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, audio, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("voices-data")


@pytest.fixture(scope="module")
def server(demo_bundle, tts_service, data_dir):
    settings = ServerSettings(model=str(demo_bundle), port=free_port(), data_dir=str(data_dir),
                              max_upload_mb=MAX_UPLOAD_MB)
    live = LiveServer(settings, tts_service).start()
    yield live
    live.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="-", max_retries=0, timeout=120)


def upload(server, name: str, data: bytes, transcript: str | None = "a short test clip",
           filename: str = "clip.wav") -> httpx.Response:
    form = {"name": name} | ({"transcript": transcript} if transcript is not None else {})
    return httpx.post(server.url + "/v1/audio/voices", data=form, files={"audio_sample": (filename, data)},
                      timeout=60)


def test_upload_list_get_use_delete(server, client):
    created = upload(server, "Ada", wav_bytes(tone(2.0)))
    assert created.status_code == 201, created.text
    voice = created.json()
    assert voice["object"] == "audio.voice" and voice["id"].startswith("voice_") and voice["name"] == "Ada"
    assert voice["kind"] == "uploaded" and voice["duration"] == pytest.approx(2.0)

    listing = httpx.get(server.url + "/v1/audio/voices").json()
    assert voice["id"] in [v["id"] for v in listing["data"]]  # OpenAI-list style
    assert "Ada" in listing["voices"]  # Kokoro style: plain names
    assert any(v["kind"] == "preset" for v in listing["data"])
    for key in (voice["id"], "Ada"):
        assert httpx.get(f"{server.url}/v1/audio/voices/{key}").json()["id"] == voice["id"]

    args = dict(model="tts-1", input="My own voice.", response_format="pcm", extra_body={"seed": 4})
    by_name = client.audio.speech.create(voice="Ada", **args).read()
    by_id = client.audio.speech.create(voice={"id": voice["id"]}, **args).read()
    preset = client.audio.speech.create(voice="alloy", **args).read()
    assert by_name == by_id and len(by_name) > 4800
    assert by_name != preset  # the reference clip conditions the model

    deleted = client.audio.voices.delete(voice["id"])
    assert deleted.deleted and deleted.id == voice["id"]
    assert httpx.get(f"{server.url}/v1/audio/voices/{voice['id']}").status_code == 404
    with pytest.raises(openai.NotFoundError):
        client.audio.voices.delete(voice["id"])
    with pytest.raises(openai.NotFoundError) as info:
        client.audio.speech.create(voice="Ada", **args)
    assert info.value.code == "voice_not_found"


def test_openai_client_creates_a_voice(server, client):
    voice = client.audio.voices.create(audio_sample=("sample.wav", wav_bytes(tone(1.5)), "audio/wav"),
                                       consent="cons_local", name="via-openai",
                                       extra_body={"transcript": "spoken words"})
    assert voice.id.startswith("voice_") and voice.name == "via-openai" and voice.type == "audio_sample"


@pytest.mark.parametrize(("fmt", "subtype", "filename"), [("FLAC", None, "a.flac"), ("MP3", None, "a.mp3"),
                                                          ("OGG", "VORBIS", "a.ogg")])
def test_compressed_uploads_are_accepted(server, fmt, subtype, filename):
    response = upload(server, f"clip-{fmt.lower()}", wav_bytes(tone(1.5), fmt=fmt, subtype=subtype),
                      filename=filename)
    assert response.status_code == 201, response.text


@pytest.mark.parametrize(("name", "data", "transcript", "status", "code"), [
    ("text-file", b"this is not audio at all " * 40, "x", 400, "unsupported_audio_format"),
    ("too-short", wav_bytes(tone(0.3)), "x", 400, "invalid_audio_duration"),
    ("too-long", wav_bytes(tone(31.0, 8000), 8000, subtype="PCM_16"), "x", 400, "invalid_audio_duration"),
    ("silent", wav_bytes(np.zeros(22050 * 2, np.float32)), "x", 400, "silent_audio"),
    ("too-large", wav_bytes(tone(8.0, 48000), 48000, subtype="FLOAT"), "x", 413, "file_too_large"),
    ("no-transcript", wav_bytes(tone(1.5)), None, 400, "missing_required_parameter"),
    ("bad/name", wav_bytes(tone(1.5)), "x", 400, "invalid_value"),
])
def test_bad_uploads_are_rejected(server, name, data, transcript, status, code):
    response = upload(server, name, data, transcript)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and set(error) == {"message", "type", "param", "code"}
    assert name not in httpx.get(server.url + "/v1/audio/voices").json()["voices"]


def test_oversized_bodies_are_refused_before_parsing(server):
    huge = b"\0" * int(3 * MAX_UPLOAD_MB * (1 << 20))
    response = upload(server, "huge", huge)
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"


def test_duplicate_and_preset_names_conflict(server, client):
    assert upload(server, "Twin", wav_bytes(tone(1.5))).status_code == 201
    with pytest.raises(openai.ConflictError) as info:
        client.audio.voices.create(audio_sample=("t.wav", wav_bytes(tone(1.5))), consent="-", name="twin",
                                   extra_body={"transcript": "x"})
    assert info.value.code == "voice_exists"
    preset = next(v["id"] for v in httpx.get(server.url + "/v1/audio/voices").json()["data"]
                  if v["kind"] == "preset")
    clash = upload(server, preset, wav_bytes(tone(1.5)))
    assert clash.status_code == 409
    with pytest.raises(openai.PermissionDeniedError):
        client.audio.voices.delete(preset)  # presets belong to the model


def test_inline_reference_audio(server, client):
    data_url = "data:audio/wav;base64," + base64.b64encode(wav_bytes(tone(1.5))).decode()
    args = dict(model="tts-1", voice="alloy", input="Inline voice.", response_format="pcm")
    audio = client.audio.speech.create(**args, extra_body={"ref_audio": data_url, "ref_text": "words"}).read()
    assert len(audio) > 4800
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.speech.create(**args, extra_body={"ref_audio": data_url})
    assert info.value.param == "ref_text"


def test_voices_survive_a_restart(server, demo_bundle, data_dir):
    created = upload(server, "Persistent", wav_bytes(tone(2.5))).json()
    args = {"model": "tts-1", "voice": "Persistent", "input": "Still here.", "response_format": "pcm",
            "seed": 8}
    before = httpx.post(server.url + "/v1/audio/speech", json=args, timeout=120).content
    server.stop()
    assert list((data_dir / "voices" / "codes").glob(f"{created['id']}--*.npy")), "codes were not cached"

    fresh = TTSService.load(TTSConfig(model_dir=demo_bundle))  # a new process would load the model again
    settings = ServerSettings(model=str(demo_bundle), port=free_port(), data_dir=str(data_dir))
    restarted = LiveServer(settings, fresh).start()
    try:
        listed = httpx.get(restarted.url + "/v1/audio/voices").json()["data"]
        assert created in [v for v in listed if v["kind"] == "uploaded"]
        after = httpx.post(restarted.url + "/v1/audio/speech", json=args, timeout=120).content
        assert after == before  # same stored codes, same seed: same audio
    finally:
        restarted.stop()
        fresh.close()
