"""Codec round-trip intelligibility: Whisper tiny.en WER of espeak-ng audio vs its codec reconstructions."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import numpy as np
from pcgtts.recipes.demo.eval_tools import Transcriber, corpus_wer
from pcgtts.recipes.demo.prepare import NUM_VAL
from pcgtts.recipes.demo.speakers import split_speakers
from pcgtts.recipes.demo.synth_corpus import render
from pcgtts.recipes.demo.text_corpus import collect_sentences


def eval_sentences(count: int, seed: int = 0) -> list[tuple[str, int]]:
    """Held-out sentences after the validation ones, each with a held-in speaker index."""
    sentences = collect_sentences(seed)[NUM_VAL:NUM_VAL + count]
    held_in, _ = split_speakers(seed)
    rng = random.Random(seed + 4)
    return [(s, rng.randrange(len(held_in))) for s in sentences]


def roundtrip_wer(systems: dict[str, Callable[[np.ndarray], np.ndarray]], count: int = 30,
                  seed: int = 0, transcriber: Transcriber | None = None) -> dict[str, dict]:
    """systems: name -> (16 kHz audio -> reconstructed audio). Returns name -> {wer, seconds}."""
    transcriber = transcriber or Transcriber()
    held_in, _ = split_speakers(seed)
    refs, hyps = [], {name: [] for name in ["original", *systems]}
    cost = dict.fromkeys(systems, 0.0)
    for text, spk in eval_sentences(count, seed):
        audio, _, _ = render(text, held_in[spk])
        refs.append(text)
        hyps["original"].append(transcriber(audio))
        for name, system in systems.items():
            start = time.time()
            out = system(audio)
            cost[name] += time.time() - start
            hyps[name].append(transcriber(out))
    report = {name: {"wer": corpus_wer(refs, h)} for name, h in hyps.items()}
    for name in systems:
        report[name]["decode_seconds"] = cost[name]
    report["_examples"] = [{"ref": r, **{n: h[i] for n, h in hyps.items()}} for i, r in enumerate(refs[:5])]
    return report
