"""Preset voices: short reference clips of held-in corpus speakers, stored as codec codes + transcript."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import soundfile as sf
from pcgtts.engine.codec.demo.features import HOP
from pcgtts.engine.speech.demo.espeak import Voice
from pcgtts.engine.speech.demo.layout import MAX_REF_FRAMES
from pcgtts.recipes.demo.speakers import split_speakers
from pcgtts.recipes.demo.synth_corpus import render
from pcgtts.recipes.demo.text_corpus import collect_sentences

# name -> held-in variant; each preset takes the first held-in speaker of that variant.
PRESETS = {"aria": "f2", "bruno": "m1", "cleo": "f4", "dmitri": "m6", "emma": "Annie", "felix": "adam",
           "greta": "linda", "hugo": "max"}
VOICE_TEXTS = slice(300, 400)  # preset transcripts: held-out sentences the evaluation does not use


def preset_speakers(seed: int = 0) -> dict[str, Voice]:
    held_in, _ = split_speakers(seed)
    out = {}
    for name, variant in PRESETS.items():
        out[name] = next(s for s in held_in if s.name == f"en-us+{variant}")
    return out


def reference_clip(voice: Voice, sentences: list[str], frames: int = MAX_REF_FRAMES):
    """The first sentence that fills a clip of at most `frames` frames, cropped: (audio, text)."""
    for text in sentences:
        audio, _, _ = render(text, voice)
        if 0.8 * frames * HOP <= len(audio) <= 1.4 * frames * HOP:
            return audio[: frames * HOP], text
    audio, _, _ = render(sentences[0], voice)
    return audio[: frames * HOP], sentences[0]


def make_presets(codec, out_dir: Path, seed: int = 0) -> dict[str, dict]:
    """Write `<name>.json` (codes, transcript, speaker) and `<name>.wav` for every preset."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pool = collect_sentences(seed)[VOICE_TEXTS]
    made = {}
    for k, (name, voice) in enumerate(preset_speakers(seed).items()):
        audio, text = reference_clip(voice, pool[k * 10:] + pool[:k * 10])
        codes = codec.encode(audio)
        spec = {"codes": codes.tolist(), "transcript": text, "speaker": voice.key,
                "note": "transcript of the clip before cropping to the prompt length"}
        (out_dir / f"{name}.json").write_text(json.dumps(spec))
        sf.write(out_dir / f"{name}.wav", (np.clip(audio, -1, 1) * 32767).astype(np.int16), codec.sample_rate)
        made[name] = spec
    return made
