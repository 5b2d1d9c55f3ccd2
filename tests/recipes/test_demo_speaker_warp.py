"""Speaker warps (recipes/demo/speaker_warp.py) and how the LM's training examples use them."""

from __future__ import annotations

import numpy as np
import torch
from pcgtts.engine.codec.demo.codec import DemoMelCodec
from pcgtts.engine.codec.demo.features import N_MELS
from pcgtts.engine.speech.demo.layout import SPEECH, DemoVocab
from pcgtts.recipes.demo.lm_data import BatchPlan, Utterances, example, make_batch
from pcgtts.recipes.demo.speaker_warp import warp_code_maps, warp_log_mel

VOCAB = DemoVocab(phonemes=tuple(f"p{i}" for i in range(10)), codebook_size=32)


def _bumps(centres: list[float]) -> torch.Tensor:
    """log-mel frames [len(centres), N_MELS], each one Gaussian bump (a formant) at a fractional band."""
    bands = torch.arange(N_MELS, dtype=torch.float32)
    return torch.stack([-5 + 4 * torch.exp(-((bands - c) / 2.0) ** 2) for c in centres])


def test_warp_moves_a_formant_up_for_alpha_above_one_and_back_down_below():
    frames = _bumps([20.0, 40.0, 55.0])
    assert torch.allclose(warp_log_mel(frames, 1.0), frames, atol=1e-5)
    up, down = warp_log_mel(frames, 1.1).argmax(1), warp_log_mel(frames, 0.9).argmax(1)
    assert (up > torch.tensor([20, 40, 55])).all() and (down < torch.tensor([20, 40, 55])).all()


def test_code_map_is_identity_unwarped_and_sends_codes_to_the_warped_neighbour():
    codebook = _bumps([float(c) for c in range(5, 75, 2)])  # 35 codes: one formant each, 2 bands apart
    codec = DemoMelCodec(codebook)
    maps = warp_code_maps(codec, (1.0, 1.15))
    assert maps.shape == (2, 35) and maps.dtype == np.int64
    assert maps[0].tolist() == list(range(35))
    # a formant moved up lands on a code whose formant sits higher (the top codes saturate)
    peak = codebook.argmax(1)
    assert (peak[maps[1]] >= peak).all() and (peak[maps[1]] > peak).float().mean() > 0.8


def test_a_warped_example_maps_reference_and_target_codes_by_the_same_table():
    utts = Utterances([[16, 17, 18]] * 2, [np.array([0, 5, 9])] * 2,
                      [np.arange(0, 30) % 32, np.arange(3, 40) % 32], np.array([0, 0]))
    table = np.roll(np.arange(32), 7)
    plain, labels = example(VOCAB, utts, 0, 1, np.random.default_rng(4), corrupt=False)
    warped, warped_labels = example(VOCAB, utts, 0, 1, np.random.default_rng(4), corrupt=False,
                                    code_map=table)

    def mapped(tokens: list[int]) -> list[int]:
        off = VOCAB.code_offset
        return [off + int(table[t - off]) if off <= t < off + 32 else t for t in tokens]

    assert warped == mapped(plain) and warped_labels == mapped(labels)
    assert warped.index(SPEECH) == plain.index(SPEECH)  # the reference (before <speech>) is warped too
    assert warped[:warped.index(SPEECH)] != plain[:plain.index(SPEECH)]


def test_warp_rate_sets_the_share_of_warped_examples_and_zero_keeps_old_batches():
    rng = np.random.default_rng(0)
    n = 64
    codes = [rng.integers(0, 16, 30) for _ in range(n)]  # codes 0..15 only: a warp moves them to 16..31
    utts = Utterances([[16, 17]] * n, [np.array([0, 10])] * n, codes, np.arange(n) % 4)
    maps = (np.arange(32)[None] + 16 * np.array([[1], [1]])) % 32  # [2, 32], each 0..15 -> 16..31
    plan = BatchPlan(utts, 16, seed=1)
    for step in range(3):
        plain = make_batch(VOCAB, utts, plan, step)
        assert torch.equal(make_batch(VOCAB, utts, plan, step, maps, 0.0)["input_ids"], plain["input_ids"])
    warped_rows = total = 0
    for step in range(40):
        labels = make_batch(VOCAB, utts, plan, step, maps, 0.5)["labels"]
        for row in labels:
            codes = row[row >= VOCAB.code_offset] - VOCAB.code_offset
            warped_rows += int((codes >= 16).all())
            total += 1
    assert 0.4 < warped_rows / total < 0.6  # 640 rows at p = 0.5: 3.2 standard errors either side
