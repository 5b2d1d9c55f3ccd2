"""Verify forwards over each row's own drafts (padding tokens skip the products) against the form before
(every row padded to the longest row's drafts), side by side in one engine per setting.

    python bench/results/ragged-verify/ab_ragged.py --settings 6:0.37 6:0.46 8:0.56 --batch-sizes 6 16 \
        --repeats 4 --out bench/results/ragged-verify

With a confidence-following draft length (γ:θ, `pcgtts bench draft-length`'s settings) rows of one step
verify different numbers of drafts; the target's forward takes the longest row's. For each setting and batch
size the bundle's speech prompts (`--utterances`, T=0.8) are decoded in consecutive batches with
ModelRunner.pack_padding on and off in turn, the order flipped every repeat
(bench.common.alternating_decodes), unseeded (a seeded row's steps run under a batch-invariance plan, which
may pad products' rows anyway); and once seeded in each form, to check that the tokens are the same.
Reports tokens/s per repeat and their ratio, and the real tokens' share of the verify forwards.
Writes OUT/ab_ragged.json and OUT/ab_ragged.md.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import torch
from pcgtts.bench.common import (
    alternating_decodes,
    bundle_engine,
    machine,
    speech_requests,
    timed_decode,
    write_json,
)
from pcgtts.bench.draft_length import parse_setting
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle


def real_share(engine, prompts, params, batch_size) -> float:
    """Of the tokens the target's verify forwards carry (rows x longest row), the share that are real."""
    runner, forward, counts = engine.target, type(engine.target).forward, [0, 0]

    def counted(self, input_ids, positions, valid, *args, **kwargs):
        if self is runner and input_ids.shape[1] > 1 and kwargs.get("states") is not None:
            counts[0] += int(valid.sum())
            counts[1] += valid.numel()
        return forward(self, input_ids, positions, valid, *args, **kwargs)

    type(engine.target).forward = counted
    try:
        timed_decode(engine, prompts, params, batch_size)
    finally:
        type(engine.target).forward = forward
    return counts[0] / max(counts[1], 1)


def packing_forms(runner) -> dict:
    """alternating_decodes' forms: the target runner with its padding multiplied (the form before) or not."""
    return {"padded": lambda: setattr(runner, "pack_padding", False),
            "packed": lambda: setattr(runner, "pack_padding", True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--rule", default="pcg")
    parser.add_argument("--settings", nargs="*", default=["6:0.37", "6:0.46", "8:0.56"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[6, 16])
    parser.add_argument("--utterances", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--prefill-batch-sizes", type=int, nargs="*", default=[],
                        help="also time prompts arriving together: each request to its first token only "
                             "(the prompts' prefill, whose chunks differ in length, and one step)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/ragged-verify"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    bundle = ModelBundle.from_dir(args.model)
    seeded_prompts, seeded_params = speech_requests(bundle, args.utterances, 0.8, args.max_tokens)
    params = [replace(p, seed=None) for p in seeded_params]
    rows = []
    for setting in args.settings:
        gamma, theta, _, _ = parse_setting(setting)
        engine = bundle_engine(bundle, args.rule, num_speculative_tokens=gamma, draft_confidence=theta)
        runner = engine.target
        forms = packing_forms(runner)
        for b in args.batch_sizes:
            same = {}
            for form, put in forms.items():
                put()
                same[form] = timed_decode(engine, seeded_prompts, seeded_params, b)[0]
            runner.pack_padding = True
            share = real_share(engine, seeded_prompts, params, b)
            res = alternating_decodes(engine, seeded_prompts, params, b, forms, args.repeats)
            row = {"setting": setting, "num_speculative_tokens": gamma, "draft_confidence": theta, "batch": b,
                   "real_token_share": share, "tokens_per_s": res["tokens_per_s"],
                   "packed_over_padded": res["ratios"], "packed_over_padded_median": res["ratio_median"],
                   "seeded_tokens_equal": same["padded"] == same["packed"]}
            rows.append(row)
            print(row, flush=True)
    for b in args.prefill_batch_sizes:  # target-only, an engine of its own each: the prefill is what differs
        engine = bundle_engine(bundle, "target-only")
        forms = packing_forms(engine.target)
        first_token = [replace(p, max_tokens=1) for p in params]
        res = alternating_decodes(engine, seeded_prompts, first_token, b, forms, args.repeats)
        seconds = {form: [len(seeded_prompts) / rate for rate in rates]  # one token per request
                   for form, rates in res["tokens_per_s"].items()}
        row = {"setting": "prefill", "batch": b, "seconds": seconds,
               "packed_over_padded": res["ratios"], "packed_over_padded_median": res["ratio_median"]}
        rows.append(row)
        print(row, flush=True)
    result = {"command": "python bench/results/ragged-verify/ab_ragged.py " + " ".join(
        f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
        for k, v in vars(args).items() if k not in ("model", "out")),
        "machine": machine(), "rule": args.rule, "utterances": args.utterances, "max_tokens": args.max_tokens,
        "repeats": args.repeats, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "ab_ragged.json", result)
    lines = [f"# Ragged verify forwards against padded ones (`{result['command']}`)", "",
             f"Machine: {machine()}. Rule {args.rule}, {args.utterances} utterances, unseeded, tokens/s per "
             "repeat (alternating; the order flipped every repeat).", "",
             "| setting | batch | real tokens / carried | padded tok/s | packed tok/s "
             "| packed / padded, median (per repeat) | seeded tokens equal |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["setting"] == "prefill":
            continue
        rates = r["tokens_per_s"]
        lines.append(f"| {r['setting']} | {r['batch']} | {r['real_token_share']:.2f} | "
                     f"{' / '.join(f'{x:.0f}' for x in rates['padded'])} | "
                     f"{' / '.join(f'{x:.0f}' for x in rates['packed'])} | "
                     f"{r['packed_over_padded_median']:.2f}x "
                     f"({', '.join(f'{x:.2f}' for x in r['packed_over_padded'])}) | "
                     f"{'yes' if r['seeded_tokens_equal'] else 'no'} |")
    prefills = [r for r in rows if r["setting"] == "prefill"]
    if prefills:
        lines += ["", f"Prompts arriving together ({args.utterances} requests to their first token, "
                  "target-only, in batches of the size given; the voices' prompt prefixes in the prefix "
                  "cache after the first decode): ms per repeat.", "",
                  "| batch | padded ms | packed ms | padded / packed, median (per repeat) |",
                  "| --- | --- | --- | --- |"]
        for r in prefills:
            lines.append(f"| {r['batch']} | {' / '.join(f'{1e3 * x:.1f}' for x in r['seconds']['padded'])} | "
                         f"{' / '.join(f'{1e3 * x:.1f}' for x in r['seconds']['packed'])} | "
                         f"{r['packed_over_padded_median']:.2f}x "
                         f"({', '.join(f'{x:.2f}' for x in r['packed_over_padded'])}) |")
    (args.out / "ab_ragged.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
