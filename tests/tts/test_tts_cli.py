"""`pcgtts synth`: one text to a WAV file through the TTS service, with the service's defaults."""

from __future__ import annotations

import pytest
import soundfile as sf

from pcgtts.cli import main


def test_synth_writes_the_spoken_text(demo_bundle, tts_service, tmp_path, capsys):
    out = tmp_path / "hello.wav"
    assert main(["synth", "Hello there.", "-o", str(out), "--model", str(demo_bundle), "--seed", "3"]) == 0
    audio, rate = sf.read(out)
    assert rate == tts_service.sample_rate and audio.ndim == 1 and audio.size > 0.2 * rate  # the codec's rate
    assert abs(audio).max() > 0.01  # speech, not silence
    assert f"wrote {out}" in capsys.readouterr().out


def test_synth_names_the_presets_for_an_unknown_voice(demo_bundle, tmp_path):
    with pytest.raises(SystemExit, match="unknown voice 'nobody'; presets: "):
        main(["synth", "Hi.", "-o", str(tmp_path / "x.wav"), "--model", str(demo_bundle),
              "--voice", "nobody"])
