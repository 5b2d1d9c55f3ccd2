"""The demo constraint's per-step planning for 16 rows, histories as lists (the build before) against the
engine's DraftedHistories (engine/speech/base.py), alternating, at several history lengths.

    python bench/results/constraint-histories/ab_histories.py \
        > bench/results/constraint-histories/ab_histories.md

A PCG step at γ = 3 calls the constraint four times per row: three draft positions (after 0, 1, 2 drafts)
and a verify call of four positions. Before, the engine built each position's history as a list (the
generated tokens plus drafts: a copy of the whole output per position and row) and the constraint checked
its memo by comparing lists; now each row's histories are a view of the request's own token list, read on
from where the last call stopped. Times the list building (before) and `_plan` (both), the merge op over
the logits excluded (the same in both). Each length's token lists grow by one token per step, as a
decode's do.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
from pcgtts.bench.common import machine
from pcgtts.engine.speech.base import DraftedHistories
from pcgtts.engine.speech.demo.constraint import MarkerMergeConstraint
from pcgtts.engine.speech.demo.layout import DemoVocab

VOCAB = DemoVocab(phonemes=tuple("abcdefghij"), codebook_size=1024)
ROWS, PROMPT, REPEATS = 16, 2, 40
CALLS = ((0, 1), (1, 1), (2, 1), (0, 4))  # (drafts before the first position, positions) of one PCG step


def main() -> None:
    rng = np.random.default_rng(0)
    print("# The constraint's planning per PCG step, 16 rows: histories as lists against the engine's "
          "views\n")
    print(f"`python bench/results/constraint-histories/ab_histories.py`. Machine: {machine()}. "
          f"Medians of {REPEATS} alternating steps.\n")
    print("| generated tokens | lists (before) | DraftedHistories (now) | before / now |")
    print("| --- | --- | --- | --- |")
    for n in (150, 600, 2000):
        tokens = [[1] * PROMPT + [16 if rng.random() < 0.1 else VOCAB.code_offset + 5 for _ in range(n)]
                  for _ in range(ROWS)]
        drafts = [[VOCAB.code_offset + 1] * 3 for _ in range(ROWS)]
        constraints = {form: [MarkerMergeConstraint(VOCAB, [16] * 400) for _ in range(ROWS)]
                       for form in ("lists", "views")}

        def step(form: str, constraints=constraints, tokens=tokens, drafts=drafts) -> None:
            for offset, count in CALLS:
                for r, constraint in enumerate(constraints[form]):
                    if form == "views":
                        constraint._plan(DraftedHistories(tokens[r], PROMPT, drafts[r], offset, count))
                    else:
                        generated = tokens[r][PROMPT:]
                        constraint._plan([generated + drafts[r][:offset + i] for i in range(count)])

        times: dict[str, list[float]] = {"lists": [], "views": []}
        for form in times:
            step(form)  # each form's memo primed
        for repeat in range(REPEATS):
            for form in ("lists", "views") if repeat % 2 == 0 else ("views", "lists"):
                for row in tokens:
                    row.append(VOCAB.code_offset + 7)
                start = time.perf_counter()
                step(form)
                times[form].append(time.perf_counter() - start)
        before, now = statistics.median(times["lists"]), statistics.median(times["views"])
        print(f"| {n} | {before * 1e3:.2f} ms | {now * 1e3:.2f} ms | {before / now:.2f}x |")


if __name__ == "__main__":
    main()
