"""The corpus speakers: espeak-ng `en-us` voice variants at several rates and pitches.

Every speaker speaks the same phoneme inventory (the variant, rate and pitch change the sound, not the
phonemes), so the serving-time front end can phonemise with plain `en-us`. A fixed subset of speakers is
held out of training for the voice-cloning evaluation.
"""

from __future__ import annotations

import random

from pcgtts.engine.speech.demo.espeak import Voice

VARIANTS = ["m1", "m2", "m3", "m4", "m5", "m6", "m7", "f1", "f2", "f3", "f4", "f5",
            "klatt", "klatt2", "klatt3", "klatt4", "Alex", "Annie", "Andy", "adam", "anika", "belinda",
            "benjamin", "david", "edward", "ian", "john", "linda", "max", "michel", "norbert", "steph"]
RATES = [140, 160, 180, 200]
PITCHES = [30, 45, 60, 75]
SPEAKERS_PER_VARIANT = 2
NUM_HELD_OUT = 8


def all_speakers(seed: int = 0) -> list[Voice]:
    """Deterministic speaker list: each variant at SPEAKERS_PER_VARIANT (rate, pitch) settings."""
    rng = random.Random(seed)
    speakers = []
    for variant in VARIANTS:
        settings = rng.sample([(r, p) for r in RATES for p in PITCHES], SPEAKERS_PER_VARIANT)
        for rate, pitch in settings:
            speakers.append(Voice(f"en-us+{variant}", rate=rate, pitch=pitch))
    return speakers


def split_speakers(seed: int = 0) -> tuple[list[Voice], list[Voice]]:
    """(held-in, held-out) speakers; held-out ones never appear in LM training."""
    speakers = all_speakers(seed)
    order = list(range(len(speakers)))
    random.Random(seed + 1).shuffle(order)
    held_out = sorted(order[:NUM_HELD_OUT])
    return ([s for i, s in enumerate(speakers) if i not in held_out], [speakers[i] for i in held_out])
