"""Self-distillation data for the feature-head draft: the target's own samples, as the engine draws them.

The head (train_draft_head.py) first learned on the corpus's teacher-forced utterances. At serving time it
drafts after contexts the target generated (temperature, decode constraint, the preset voices), which are
not the corpus's: a head trained on the target's own samples sees at training what it sees when it drafts
(Medusa-2 and EAGLE train on the target's generations for this reason). This module decodes sentences the
corpus never used in the bundle's preset voices with the engine, target-only, and gives the sequences as
(prompt ids, generated ids); `sequence_batches` turns them into train_head's batches.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from pcgtts.recipes.demo.lm_data import IGNORE, collate
from pcgtts.recipes.demo.synth_corpus import NUM_HELD_OUT_SENTENCES

# Sentences from here on in collect_sentences' order: past the held-out ones and the corpus's training ones
# (12,000 at most), so the head's new data shares no sentence with the evaluation sets.
FIRST_SENTENCE = NUM_HELD_OUT_SENTENCES + 20_000
HELD_OUT_SEQUENCES = 96  # the last generated sequences: held out to measure the head on


def generate_sequences(bundle_dir: Path, count: int, out: Path, *, temperature: float = 0.8,
                       max_tokens: int = 400, batch_size: int = 16, seed: int = 0) -> list[dict]:
    """Decode `count` new sentences (cycling the preset voices) target-only; writes and returns a list of
    {"prompt": ids, "generated": ids}. Resumes from `out` (JSON lines) if it holds some already."""
    from pcgtts.bench.common import bundle_engine, speech_requests
    from pcgtts.recipes.demo.text_corpus import collect_sentences, ensure_text_packages
    from pcgtts.tts.bundle import ModelBundle

    done = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    if len(done) >= count:
        return done[:count]
    ensure_text_packages()  # the stage may run on its own, on a machine that never ran stage corpus
    bundle = ModelBundle.from_dir(bundle_dir)
    sentences = collect_sentences(seed)[FIRST_SENTENCE:FIRST_SENTENCE + count]
    all_prompts, all_params = speech_requests(bundle, count, temperature, max_tokens, seed,
                                              sentences=sentences)
    engine = bundle_engine(bundle, "target-only", max_num_seqs=batch_size)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        for lo in range(len(done), count, batch_size):
            prompts, params = all_prompts[lo:lo + batch_size], all_params[lo:lo + batch_size]
            for prompt_ids, gen in zip(prompts, engine.generate(prompts, params), strict=True):
                row = {"prompt": list(prompt_ids), "generated": list(gen.token_ids)}
                f.write(json.dumps(row) + "\n")
                done.append(row)
            f.flush()
            print(f"[self-distill] {len(done)} / {count} sequences", flush=True)
    return done


def sequence_pair(row: dict) -> tuple[list[int], list[int]]:
    """(input ids, labels) of one generated sequence: the loss reads only its generated positions."""
    prompt, generated = row["prompt"], row["generated"]
    inputs = prompt + generated[:-1]
    labels = [IGNORE] * (len(prompt) - 1) + generated
    return inputs, labels


def sequence_batches(rows: list[dict], batch_size: int, seed: int
                     ) -> Callable[[int], dict[str, torch.Tensor]]:
    """step -> a batch of `batch_size` sequences, a fresh seeded permutation each epoch (deterministic, so a
    resumed run sees the batches it would have seen)."""
    per_epoch = max(1, len(rows) // batch_size)

    def batch(step: int) -> dict[str, torch.Tensor]:
        epoch, k = divmod(step, per_epoch)
        order = np.random.default_rng([seed, epoch]).permutation(len(rows))
        return collate([sequence_pair(rows[i]) for i in order[k * batch_size:(k + 1) * batch_size]])

    return batch


@torch.no_grad()
def held_out_alpha_by_step(target, head, rows: list[dict], *, steps: int = 4, temperature: float = 0.8,
                           batch_size: int = 12) -> list[float]:
    """Per draft step k = 1..steps, the mean Σ_t min(p(t), q(t)) between the head's k-th chained proposal and
    the target, teacher-forced on held-out generated sequences, both at `temperature` (without the decode
    constraint, which needs each prompt's phonemes: the target puts next to no mass where it masks)."""
    from pcgtts.engine.acceptance.warp import logits_to_probs
    from pcgtts.recipes.demo.train_draft_head import target_states

    shares: list[list[torch.Tensor]] = [[] for _ in range(steps)]
    for lo in range(0, len(rows), batch_size):
        batch = collate([sequence_pair(r) for r in rows[lo:lo + batch_size]])
        hidden = target_states(target, batch)  # [B, L, d]
        keep = batch["labels"] != IGNORE  # [B, L]
        q_all = logits_to_probs(target.lm_head(hidden).float(), temperature)  # [B, L, V]
        for k, states in enumerate(head.unroll(hidden, batch["input_ids"], steps), 1):
            at = keep[:, k:]  # step k's state j stands for position j + k
            p = logits_to_probs(target.lm_head(states[at]).float(), temperature)  # [n, V]
            shares[k - 1].append(torch.minimum(p, q_all[:, k:][at]).sum(-1))
    return [float(torch.cat(s).mean()) for s in shares]
