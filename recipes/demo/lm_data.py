"""Training examples for the demo LMs: (reference clip, target utterance) pairs in the demo layout.

Everything random (batch order, reference choice and crop, input-code corruption) is drawn from RNGs
seeded by (seed, step), so a run resumed from a checkpoint sees exactly the batches it would have seen.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch
from pcgtts.engine.speech.demo.layout import MAX_REF_FRAMES, DemoVocab, prompt_tokens, speech_tokens

IGNORE = -100
NO_REF_RATE = 0.05  # share of examples without a reference clip (the model can then speak voiceless)
CORRUPT_RATE = 0.10  # share of input codes in the target speech replaced at random (exposure bias)
BUCKET_BATCHES = 32  # batches sorted by length together, to limit padding


@dataclass
class Utterances:
    phoneme_ids: list[list[int]]
    starts: list[np.ndarray]  # int [P_i] first frame of each phoneme
    codes: list[np.ndarray]  # int [T_i]
    speaker: np.ndarray  # int [n]

    def __len__(self) -> int:
        return len(self.codes)

    @cached_property
    def groups(self) -> dict[int, np.ndarray]:
        """speaker -> indices of that speaker's utterances."""
        return {int(s): np.flatnonzero(self.speaker == s) for s in np.unique(self.speaker)}


def example(vocab: DemoVocab, utts: Utterances, i: int, ref: int | None, rng: np.random.Generator,
            corrupt: bool, code_map: np.ndarray | None = None) -> tuple[list[int], list[int]]:
    """(input ids, labels) for target utterance i spoken after reference utterance `ref`; code_map
    (int [codebook_size], see speaker_warp) turns both into a pseudo-speaker's voice."""
    clip, codes = reference_clip(utts, ref, rng), utts.codes[i]
    if code_map is not None:
        clip, codes = (None if clip is None else code_map[clip]), code_map[codes]
    prompt = prompt_tokens(vocab, clip, utts.phoneme_ids[i])
    speech = speech_tokens(vocab, utts.phoneme_ids[i], utts.starts[i], codes)
    inputs = np.array(prompt + speech[:-1], dtype=np.int64)
    labels = np.array([IGNORE] * (len(prompt) - 1) + speech, dtype=np.int64)
    if corrupt:
        part = inputs[len(prompt):]  # view into the target speech inputs
        is_code = part >= vocab.code_offset
        flip = is_code & (rng.random(len(part)) < CORRUPT_RATE)
        part[flip] = vocab.code_offset + rng.integers(0, vocab.codebook_size, int(flip.sum()))
    return inputs.tolist(), labels.tolist()


def reference_clip(utts: Utterances, ref: int | None, rng: np.random.Generator) -> np.ndarray | None:
    """int [≤ MAX_REF_FRAMES] codes: a random window of utterance `ref` (None: no reference)."""
    if ref is None:
        return None
    codes = utts.codes[ref]
    off = int(rng.integers(0, max(1, len(codes) - MAX_REF_FRAMES + 1)))
    return codes[off:off + MAX_REF_FRAMES]


def pick_reference(utts: Utterances, groups: dict[int, np.ndarray], i: int, rng: np.random.Generator):
    if rng.random() < NO_REF_RATE:
        return None
    same = groups[int(utts.speaker[i])]
    if len(same) < 2:
        return None
    while True:
        r = int(same[rng.integers(0, len(same))])
        if r != i:
            return r


def collate(pairs: list[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
    """Right-padded batch: input_ids, attention_mask, labels, all [B, L]."""
    length = max(len(x) for x, _ in pairs)
    ids = torch.zeros(len(pairs), length, dtype=torch.long)
    mask = torch.zeros(len(pairs), length, dtype=torch.long)
    labels = torch.full((len(pairs), length), IGNORE, dtype=torch.long)
    for b, (x, y) in enumerate(pairs):
        ids[b, :len(x)] = torch.tensor(x)
        mask[b, :len(x)] = 1
        labels[b, :len(y)] = torch.tensor(y)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


class BatchPlan:
    """Deterministic batches: step -> utterance indices, epoch permutations bucketed by length."""

    def __init__(self, utts: Utterances, batch_size: int, seed: int):
        self.utts, self.batch_size, self.seed = utts, batch_size, seed
        self.per_epoch = len(utts) // batch_size
        pairs = zip(utts.codes, utts.phoneme_ids, strict=True)
        self.lengths = np.array([len(c) + 2 * len(p) for c, p in pairs])
        self._epoch, self._batches = -1, []

    def _epoch_batches(self, epoch: int) -> list[np.ndarray]:
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(len(self.utts))[: self.per_epoch * self.batch_size]
        span = self.batch_size * BUCKET_BATCHES
        batches = []
        for s in range(0, len(order), span):
            chunk = order[s:s + span]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            batches.extend(chunk[k:k + self.batch_size] for k in range(0, len(chunk), self.batch_size))
        return [batches[k] for k in rng.permutation(len(batches))]

    def batch(self, step: int) -> np.ndarray:
        epoch, k = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            self._epoch, self._batches = epoch, self._epoch_batches(epoch)
        return self._batches[k]


def held_out_batches(vocab: DemoVocab, utts: Utterances, rng: np.random.Generator, batch_size: int,
                     count: int | None = None) -> Iterator[tuple[range, dict[str, torch.Tensor]]]:
    """(rows, batch) over utterances 0 .. count-1 in order, teacher-forced for evaluation: each with a
    reference of its speaker drawn from `rng` and no corrupted inputs."""
    end = len(utts) if count is None else min(count, len(utts))
    for lo in range(0, end, batch_size):
        rows = range(lo, min(end, lo + batch_size))
        yield rows, collate([example(vocab, utts, i, pick_reference(utts, utts.groups, i, rng), rng,
                                     corrupt=False) for i in rows])


def make_batch(vocab: DemoVocab, utts: Utterances, plan: BatchPlan, step: int,
               code_maps: np.ndarray | None = None, warp_rate: float = 0.0) -> dict[str, torch.Tensor]:
    """code_maps: int [A, codebook_size] speaker warps; each example takes a random one with probability
    warp_rate (no random draws at all when warp_rate is 0, so older runs' batches are unchanged)."""
    groups = utts.groups
    rng = np.random.default_rng([plan.seed, step, 1])
    pairs = []
    for i in plan.batch(step):
        ref = pick_reference(utts, groups, int(i), rng)
        code_map = None
        if warp_rate > 0 and rng.random() < warp_rate:
            code_map = code_maps[rng.integers(0, len(code_maps))]
        pairs.append(example(vocab, utts, int(i), ref, rng, corrupt=True, code_map=code_map))
    return collate(pairs)
