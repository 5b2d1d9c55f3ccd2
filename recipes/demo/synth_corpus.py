"""Render the training corpus with espeak-ng: log-mel frames plus frame-level phoneme alignments.

Utterance k speaks training sentence k with a held-in speaker drawn by a seeded RNG. Shards of
SHARD_SIZE utterances are written as `.npz` files; existing shards are kept, so an interrupted run
resumes. Audio itself is not stored: it is re-rendered on demand (espeak-ng is deterministic).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import random
import time
from pathlib import Path

import numpy as np
import soxr
from pcgtts.engine.codec.demo.features import HOP, SAMPLE_RATE, MelSpec
from pcgtts.engine.speech.demo.espeak import ESPEAK_RATE, Voice, synthesize
from pcgtts.recipes.demo.speakers import split_speakers
from pcgtts.recipes.demo.text_corpus import collect_sentences

SHARD_SIZE = 500
NUM_HELD_OUT_SENTENCES = 400  # the first sentences of the shuffled list never reach training


def render(text: str, voice: Voice) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Speak `text` -> (16 kHz audio [frames * HOP], phonemes, start frame of each phoneme)."""
    utt = synthesize(text, voice)
    audio = soxr.resample(utt.audio, ESPEAK_RATE, SAMPLE_RATE).astype(np.float32)
    frames = len(audio) // HOP
    starts = np.round(utt.starts * (SAMPLE_RATE / ESPEAK_RATE) / HOP).astype(np.int64)
    starts = np.clip(np.maximum.accumulate(starts), 0, frames)
    return audio[: frames * HOP], utt.phonemes, starts


def plan(num_utterances: int, seed: int = 0) -> list[tuple[int, str, int]]:
    """(sentence index, sentence, speaker index into held-in speakers) for every training utterance."""
    sentences = collect_sentences(seed)
    held_in, _ = split_speakers(seed)
    rng = random.Random(seed + 2)
    train = sentences[NUM_HELD_OUT_SENTENCES: NUM_HELD_OUT_SENTENCES + num_utterances]
    return [(NUM_HELD_OUT_SENTENCES + i, s, rng.randrange(len(held_in))) for i, s in enumerate(train)]


def _render_shard(args: tuple[Path, int, list[tuple[int, str, int]], int]) -> str:
    out_dir, shard, items, seed = args
    path = out_dir / f"shard_{shard:04d}.npz"
    if path.exists():
        return f"{path.name} (kept)"
    held_in, _ = split_speakers(seed)
    mel_spec = MelSpec()
    mels, phonemes, starts, lengths, num_phonemes = [], [], [], [], []
    for _, text, speaker in items:
        audio, phs, st = render(text, held_in[speaker])
        mel = mel_spec.log_mel(audio).numpy().astype(np.float16)
        mels.append(mel)
        phonemes.extend(phs)
        starts.append(st)
        lengths.append(len(mel))
        num_phonemes.append(len(phs))
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, mel=np.concatenate(mels), lengths=np.array(lengths), phonemes=np.array(phonemes),
             starts=np.concatenate(starts), num_phonemes=np.array(num_phonemes),
             sentence=np.array([i for i, _, _ in items]), speaker=np.array([s for _, _, s in items]),
             text=np.array([t for _, t, _ in items]))
    tmp.rename(path)
    return path.name


def synth_corpus(out_dir: Path, num_utterances: int, seed: int = 0, workers: int = 2) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    items = plan(num_utterances, seed)
    (out_dir / "plan.json").write_text(json.dumps({"num_utterances": num_utterances, "seed": seed}))
    jobs = [(out_dir, k, items[k * SHARD_SIZE:(k + 1) * SHARD_SIZE], seed)
            for k in range((len(items) + SHARD_SIZE - 1) // SHARD_SIZE)]
    start = time.time()
    with mp.get_context("spawn").Pool(workers) as pool:
        for done, name in enumerate(pool.imap(_render_shard, jobs), 1):
            print(f"[corpus] {done}/{len(jobs)} {name} {time.time() - start:.0f}s", flush=True)


def load_corpus(out_dir: Path) -> dict:
    """All shards as flat lists: mel [T_i, 80] float16, phonemes list[str], starts int [P_i], ..."""
    corpus: dict[str, list] = {k: [] for k in ("mel", "phonemes", "starts", "sentence", "speaker", "text")}
    for path in sorted(out_dir.glob("shard_*[0-9].npz")):
        with np.load(path) as f:
            z = {k: f[k] for k in f.files}  # each f[k] access re-reads the array: read once
        mel_off = np.concatenate([[0], np.cumsum(z["lengths"])])
        ph_off = np.concatenate([[0], np.cumsum(z["num_phonemes"])])
        for i in range(len(z["lengths"])):
            corpus["mel"].append(z["mel"][mel_off[i]:mel_off[i + 1]])
            corpus["phonemes"].append([str(p) for p in z["phonemes"][ph_off[i]:ph_off[i + 1]]])
            corpus["starts"].append(z["starts"][ph_off[i]:ph_off[i + 1]])
        corpus["sentence"].extend(int(x) for x in z["sentence"])
        corpus["speaker"].extend(int(x) for x in z["speaker"])
        corpus["text"].extend(str(x) for x in z["text"])
    return corpus
