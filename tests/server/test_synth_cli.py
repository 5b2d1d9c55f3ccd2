"""`pcgtts synth` is the server's twin: for the same text, voice and seed it writes the speech the API
returns (stream=false), knows the same voices (OpenAI names, uploaded ones), picks the format from the
file's extension, and fails with a message and an exit code instead of a traceback."""

from __future__ import annotations

import io
import subprocess
import sys

import httpx
import numpy as np
import pytest
import soundfile as sf
from server_support import tone

from pcgtts.cli import main

TEXT = "The command line speaks like the server."


def synth(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["synth", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def same_speech(ours: bytes, theirs: bytes) -> None:
    """The same utterance: same rate and length, and the same waveform up to float rounding (the live
    server's engine thread and the CLI's may run torch with different thread counts, and the order of a
    float sum can differ by that), far closer than another voice or seed would come."""
    a, rate_a = sf.read(io.BytesIO(ours), dtype="float32")
    b, rate_b = sf.read(io.BytesIO(theirs), dtype="float32")
    assert rate_a == rate_b == 24000 and a.size == b.size
    assert np.corrcoef(a, b)[0, 1] > 0.95


def api_audio(live_server, fmt: str, voice: str, seed: int = 3) -> bytes:
    body = {"model": "tts-1", "input": TEXT, "voice": voice, "response_format": fmt, "seed": seed,
            "stream": False}
    response = httpx.post(live_server.url + "/v1/audio/speech", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.content


@pytest.mark.parametrize(("name", "fmt"), [("out.flac", "flac"), ("out.wav", "wav")])
def test_synth_writes_what_the_api_returns(live_server, demo_bundle, tmp_path, capsys, name, fmt):
    """An OpenAI voice name, 24 kHz, the format from the extension, and the API's very bytes."""
    out = tmp_path / name
    code, printed, err = synth(capsys, TEXT, "-o", str(out), "--voice", "alloy", "--seed", "3",
                               "--model", str(demo_bundle), "--data-dir", str(tmp_path / "data"))
    assert code == 0, err
    assert printed.startswith(f"wrote {out}: {fmt}")
    data = out.read_bytes()
    info = sf.info(io.BytesIO(data))
    assert info.samplerate == 24000 and info.channels == 1 and info.frames > 4800
    same_speech(data, api_audio(live_server, fmt, "alloy"))
    assert np.corrcoef(*(sf.read(io.BytesIO(x), dtype="float32")[0][:4800] for x in (
        data, api_audio(live_server, fmt, "alloy", seed=4))))[0, 1] < 0.95  # another seed: other speech


def test_synth_speaks_with_a_voice_uploaded_to_the_server(live_server, demo_bundle, tmp_path, capsys):
    buf = io.BytesIO()
    sf.write(buf, tone(2.0), 22050, format="WAV")
    upload = httpx.post(live_server.url + "/v1/audio/voices", timeout=60,
                        data={"name": "cli-voice", "transcript": "a clip for the command line"},
                        files={"audio_sample": ("clip.wav", buf.getvalue(), "audio/wav")})
    assert upload.status_code in (200, 201), upload.text
    out = tmp_path / "uploaded.wav"
    code, _, err = synth(capsys, TEXT, "-o", str(out), "--voice", "cli-voice", "--seed", "3",
                         "--model", str(demo_bundle), "--data-dir", live_server.settings.data_dir)
    assert code == 0, err
    same_speech(out.read_bytes(), api_audio(live_server, "wav", "cli-voice"))


def test_help_names_the_default_output_file():
    done = subprocess.run([sys.executable, "-m", "pcgtts.cli", "synth", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "default: out.wav" in " ".join(done.stdout.split())


@pytest.mark.parametrize(("args", "message"), [
    (["", "-o", "x.wav"], "TEXT is empty"),
    (["Hello.", "-o", "x.doc"], "cannot tell the format"),
    (["Hello.", "-o", "x.wav", "--acceptance", "bogus"], "unknown acceptance rule 'bogus'"),
    (["Hello.", "-o", "x.wav", "--voice", "nobody"], "Voice 'nobody' not found"),
])
def test_bad_input_is_a_clean_error_with_exit_code_2(demo_bundle, tmp_path, args, message):
    done = subprocess.run([sys.executable, "-m", "pcgtts.cli", "synth", *args, "--model", str(demo_bundle),
                           "--data-dir", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("pcgtts synth: error: ") and message in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "x.wav").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["Hello.", "-o", "no-such-folder/x.wav"], "the folder 'no-such-folder' does not exist"),
    (["Hello.", "-o", "x.wav", "--speed", "9"], "Invalid value for 'speed'"),
    (["Hello.", "-o", "x.wav", "--temperature", "5"], "Invalid value for 'temperature'"),
    (["", "-o", "x.wav"], "TEXT is empty"),
    (["Hello.", "-o", "x.doc"], "cannot tell the format"),
])
def test_arguments_are_checked_before_anything_loads(tmp_path, args, message):
    """A model directory that does not exist: had the command loaded anything before checking its own
    arguments, it would have failed on the model instead."""
    done = subprocess.run([sys.executable, "-m", "pcgtts.cli", "synth", *args, "--model",
                           str(tmp_path / "no-model"), "--data-dir", str(tmp_path)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("pcgtts synth: error: ") and message in done.stderr, done.stderr
    assert "no-model" not in done.stderr and not list(tmp_path.glob("*.wav"))
