"""Corpus -> training data: phoneme vocabulary, k-means codebook, codes of every utterance, validation set.

Writes `codec/` (codebook, no decoder net yet) and `data.pt` (vocabulary, train and validation utterances)
under the run directory.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np
import torch
from pcgtts.engine.codec.demo.codec import DemoMelCodec
from pcgtts.engine.codec.demo.features import LOG_FLOOR
from pcgtts.engine.speech.demo.layout import MAX_PHONEMES, DemoVocab
from pcgtts.recipes.demo.fit_codec import fit_kmeans, sample_frames
from pcgtts.recipes.demo.lm_data import Utterances
from pcgtts.recipes.demo.speakers import split_speakers
from pcgtts.recipes.demo.synth_corpus import load_corpus, render
from pcgtts.recipes.demo.text_corpus import collect_sentences

NUM_VAL = 160  # held-out sentences spoken by held-in speakers, for the validation loss


def build_vocab(phoneme_lists: list[list[str]], codebook_size: int) -> DemoVocab:
    inventory = sorted({p for phs in phoneme_lists for p in phs})
    if len(inventory) > MAX_PHONEMES:
        raise ValueError(f"{len(inventory)} phonemes exceed the {MAX_PHONEMES} slots")
    return DemoVocab(phonemes=tuple(inventory), codebook_size=codebook_size)


def render_held_out(codec: DemoMelCodec, vocab: DemoVocab, count: int, seed: int = 0) -> Utterances:
    """Held-out sentences spoken by held-in speakers (speaker ids index the held-in list)."""
    sentences = collect_sentences(seed)[:count]
    held_in, _ = split_speakers(seed)
    rng = random.Random(seed + 3)
    speakers = [rng.randrange(len(held_in)) for _ in sentences]
    utts = Utterances([], [], [], np.array(speakers))
    for text, spk in zip(sentences, speakers, strict=True):
        audio, phonemes, starts = render(text, held_in[spk])
        utts.phoneme_ids.append(vocab.phoneme_ids(phonemes))
        utts.starts.append(starts)
        utts.codes.append(codec.encode(audio))
    return utts


def prepare(run_dir: Path, codebook_size: int = 1024, kmeans_frames: int = 400_000, seed: int = 0,
            init_from: Path | None = None) -> None:
    """init_from: a bundle whose codebook and vocabulary are kept (continued training needs the same
    tokens); otherwise both are made from the corpus."""
    start = time.time()
    corpus = load_corpus(run_dir / "corpus")
    print(f"[prepare] {len(corpus['mel'])} utterances loaded {time.time() - start:.0f}s", flush=True)
    if init_from is not None:
        vocab = DemoVocab.load(init_from / "family.json")
        codec = DemoMelCodec(DemoMelCodec.from_dir(init_from / "codec").codebook)
    else:
        vocab = build_vocab(corpus["phonemes"], codebook_size)
        frames = sample_frames(corpus["mel"], kmeans_frames, seed)
        codec = DemoMelCodec(fit_kmeans(frames, codebook_size, seed=seed))
    codec.save(run_dir / "codec")
    floor = float(np.log(LOG_FLOOR))  # the corpus stores log-mel with a lower floor
    codes = [codec.quantize(torch.from_numpy(m.astype(np.float32)).clamp(min=floor)) for m in corpus["mel"]]
    train = Utterances(phoneme_ids=[vocab.phoneme_ids(p) for p in corpus["phonemes"]],
                       starts=corpus["starts"], codes=codes, speaker=np.array(corpus["speaker"]))
    val = render_held_out(codec, vocab, NUM_VAL, seed)
    usage = np.bincount(np.concatenate(codes), minlength=codebook_size)
    print(f"[prepare] {len(vocab.phonemes)} phonemes, codes used {int((usage > 0).sum())}/{codebook_size}, "
          f"{time.time() - start:.0f}s", flush=True)
    torch.save({"vocab": vocab, "train": train, "val": val, "text": corpus["text"]}, run_dir / "data.pt")
