"""The speculation policy's choices over single-stream decodes, step by step: which draft length each step
ran, what each length's steps cost and emitted, and the policy's estimates at the end.

    python bench/results/spec-lengths/policy_trace.py --lengths 5 --utterances 6 --max-tokens 200

Unseeded PCG requests of the bundle decoded one after another (batch 1) by an engine under the "auto"
policy with γ 3 and the extra lengths; prints a line per length (steps, median / p10 / p90 ms per step,
mean tokens per step), the policy's timings and tokens per step, and the sequence of lengths (first 400
steps). Writes nothing.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

import torch
from pcgtts.bench.common import bundle_engine, speech_requests
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="*", default=[5])
    parser.add_argument("--utterances", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    bundle = ModelBundle.from_dir(DEFAULT_MODEL_DIR)
    engine = bundle_engine(bundle, "pcg", speculation="auto", speculation_lengths=tuple(args.lengths))
    prompts, params = speech_requests(bundle, args.utterances, 0.8, args.max_tokens)
    policy, steps = engine.policy, []
    record = policy.record

    def traced(batch: int, gamma: int, seconds: float, tokens: int) -> None:
        record(batch, gamma, seconds, tokens)
        steps.append((gamma, seconds / batch * 1e3, tokens / batch))

    policy.record = traced
    for prompt, p in zip(prompts, params, strict=True):
        engine.generate([prompt], [replace(p, seed=None)])  # the policy decides for unseeded requests
    for gamma in policy.choices:
        ms = sorted(x[1] for x in steps if x[0] == gamma)
        if ms:
            tokens = statistics.fmean(x[2] for x in steps if x[0] == gamma)
            print(f"γ {gamma}: {len(ms)} steps, ms per step median {statistics.median(ms):.2f} "
                  f"(p10 {ms[len(ms) // 10]:.2f}, p90 {ms[9 * len(ms) // 10]:.2f}), "
                  f"{tokens:.2f} tokens per step")
    print("policy timings (ms):", {g: round(t.seconds * 1e3, 2) for (_, g), t in policy._timings.items()
                                   if t.seconds})
    print("policy tokens per step:", {g: round(policy.tokens_per_seq(g), 2) for g in policy.choices if g})
    print("lengths run:", "".join(str(x[0]) for x in steps[:400]))


if __name__ == "__main__":
    main()
