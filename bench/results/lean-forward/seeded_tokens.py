"""Do seeded requests decode the same tokens with the lean forward as with the build before? (issue 32: seeded
outputs unchanged by the speed work except where batch invariance changes them on purpose)

    python bench/results/lean-forward/seeded_tokens.py > bench/results/lean-forward/seeded_tokens.md

Decodes `--utterances` seeded speech requests (the bundle's prompts and voices, seed i, T = 0.8) at batch 16,
once in the `before` forms (torch RoPE, K/V writes and norms) and once in this build's (ab_forward.py's
FormSwitch), per rule, and counts the requests whose tokens are identical, and where the others first part.
Fused RoPE computes the same bits as before; the compiled norms round differently (float32 rounding of the
same formula), so a draw that lands within that rounding of a boundary can change.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import torch
from pcgtts.bench.common import bundle_engine, machine, speech_requests, timed_decode
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle

HERE = Path(__file__).parent


def form_switch():
    spec = importlib.util.spec_from_file_location("ab_forward", HERE / "ab_forward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FormSwitch()


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--utterances", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(1)  # the engine's CPU default
    bundle = ModelBundle.from_dir(args.model)
    switch = form_switch()
    print("# Seeded tokens, the build before's forward forms against this build's\n")
    print(f"`python bench/results/lean-forward/seeded_tokens.py --utterances {args.utterances} --max-tokens "
          f"{args.max_tokens}`. Machine: {machine()}. Batch 16, seeds 0..{args.utterances - 1}.\n")
    print("| rule | identical requests | tokens (before) | where the others first differ (token index) |")
    print("| --- | --- | --- | --- |")
    for rule in ("target-only", "pcg"):
        engine = bundle_engine(bundle, rule, max_num_seqs=16)
        prompts, params = speech_requests(bundle, args.utterances, 0.8, args.max_tokens)
        tokens = {}
        for form in ("before", "this build"):
            switch.set(form)
            tokens[form], _ = timed_decode(engine, prompts, params, 16)
        switch.set("this build")
        pairs = list(zip(tokens["before"], tokens["this build"], strict=True))
        same = sum(a == b for a, b in pairs)
        differ = [first_difference(a, b) for a, b in pairs if a != b]
        compared = sum(len(a) for a, _ in pairs)
        print(f"| {rule} | {same} of {len(pairs)} | {compared} | {', '.join(map(str, differ)) or '-'} |")


if __name__ == "__main__":
    main()
