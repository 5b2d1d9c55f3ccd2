"""One batched forward of the target, timed in three forms side by side inside one decode (issue 32 §2).

    python bench/results/lean-forward/ab_forward.py --rules target-only pcg --batch 16 \
        --out bench/results/lean-forward

Decodes `--batch` of the bundle's speech requests together; at the `--at` th batched forward of the
target (a decode forward for target-only, a verify forward of γ+1 tokens per row for PCG) it runs that same
forward, over the same K/V, in each form in turn, `--repeats` times alternating (the order flipped every
round), then lets the decode go on:

    before          RoPE as torch ops, the K/V written by index_put_, RMSNorm by torch (the build before)
    compiled norms  the same with the compiled RMSNorm (engine/ops/rms_norm.py)
    this build      RoPE fused into the K/V writes (engine/ops/rope_kv.py) and the compiled RMSNorm

Rewriting the same K/V slots with the same values leaves the decode unchanged. Reports the median time
of each form, its ratio to `before`, and whether its hidden states are the same bits as `before`'s (the
compiled norms round differently; RoPE's fusion does not).

Then whole decodes, `before` against `this build` in one engine per rule: the `--utterances` requests
(seeded, `--seeded`, or not) decoded in consecutive batches of each `--batch-sizes`, the two forms
alternating repeat after repeat (`--decode-repeats`), tokens/s of each and the median of the per-repeat
ratios (a shared machine drifts by more than the change between runs minutes apart).
Writes OUT/ab_forward.json and OUT/ab_forward.md.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch
from pcgtts.bench.common import (
    alternating_decodes,
    alternating_forwards,
    bundle_engine,
    machine,
    speech_requests,
    write_json,
)
from pcgtts.engine import attention
from pcgtts.engine.model import llama
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle

FORMS = {"before": (False, False), "compiled norms": (False, True), "this build": (True, True)}


class FormSwitch:
    """Turns the fused RoPE and the compiled norms off and on for the engine's forwards."""

    def __init__(self):
        self.fuse, self.norms = True, True
        fuses, norm_call = attention.GatherSDPABackend.fuses_rope, llama.RMSNorm.__call__
        switch = self

        def fuses_rope(backend, meta):
            return switch.fuse and fuses(backend, meta)

        def norm(rms, x):
            compiled = rms.compiled
            rms.compiled = compiled and switch.norms
            try:
                return norm_call(rms, x)
            finally:
                rms.compiled = compiled

        attention.GatherSDPABackend.fuses_rope = fuses_rope
        llama.RMSNorm.__call__ = norm

    def set(self, form: str) -> None:
        self.fuse, self.norms = FORMS[form]


def measure(rule: str, args) -> list[dict]:
    bundle = ModelBundle.from_dir(args.model)
    engine = bundle_engine(bundle, rule, max_num_seqs=args.batch)
    engine.generate(*speech_requests(bundle, 2, 0.8, 20))  # warm-up
    switch = FormSwitch()
    forms = {form: partial(switch.set, form) for form in FORMS}
    rows = alternating_forwards(engine, *speech_requests(bundle, args.batch, 0.8, args.max_tokens), forms,
                                args.at, args.repeats)
    return [{"rule": rule, **row} for row in rows]


def decodes(rule: str, args) -> list[dict]:
    """Whole decodes, `before` and `this build` alternating in one engine."""
    bundle = ModelBundle.from_dir(args.model)
    engine = bundle_engine(bundle, rule, max_num_seqs=max(args.batch_sizes))
    switch = FormSwitch()
    prompts, params = speech_requests(bundle, args.utterances, 0.8, args.max_tokens)
    if not args.seeded:
        params = [replace(p, seed=None) for p in params]
    engine.generate(*speech_requests(bundle, 2, 0.8, 20))  # warm-up
    rows = []
    for batch in args.batch_sizes:
        ab = alternating_decodes(engine, prompts, params, batch,
                                 {form: partial(switch.set, form) for form in ("before", "this build")},
                                 args.decode_repeats)
        switch.set("this build")
        rows.append({"rule": rule, "batch": batch, "seeded": args.seeded, **ab})
    return rows


def markdown(result: dict) -> str:
    lines = [f"# One batched forward in three forms (`{result['command']}`)", "",
             f"Machine: {result['machine']}. Medians of {result['repeats']} alternating runs of the same "
             "forward.", "",
             "| rule | rows x tokens | context | form | ms | before / form | same bits as before |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in result["rows"]:
        for form, r in row["forms"].items():
            bits = "yes" if r["max_abs_diff"] == 0 else f"no (max abs diff {r['max_abs_diff']:.1e})"
            lines.append(f"| {row['rule']} | {row['rows']} x {row['tokens_per_row']} | {row['context']} | "
                         f"{form} | {r['ms']:.2f} | {r['first_over_this']:.2f}x | {bits} |")
    if result["decodes"]:
        kind = "seeded" if result["seeded"] else "unseeded"
        lines += ["", f"Whole decodes ({result['utterances']} utterances, {result['max_tokens']} tokens at "
                  f"most, {kind}), tokens/s, the two forms alternating:", "",
                  "| rule | batch | before | this build | this / before, median (per repeat) |",
                  "| --- | --- | --- | --- | --- |"]
        for row in result["decodes"]:
            rates = row["tokens_per_s"]
            lines.append(f"| {row['rule']} | {row['batch']} | {statistics.median(rates['before']):.0f} | "
                         f"{statistics.median(rates['this build']):.0f} | {row['ratio_median']:.2f}x "
                         f"({', '.join(f'{r:.2f}' for r in row['ratios'])}) |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--rules", nargs="+", default=["target-only", "pcg"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--at", type=int, nargs="+", default=[20, 35], help="which batched forwards to time")
    parser.add_argument("--repeats", type=int, default=80)
    parser.add_argument("--max-tokens", type=int, default=150)
    parser.add_argument("--batch-sizes", type=int, nargs="*", default=[1, 6, 16],
                        help="whole decodes at these batch sizes (none: skip them)")
    parser.add_argument("--utterances", type=int, default=16)
    parser.add_argument("--decode-repeats", type=int, default=4)
    parser.add_argument("--seeded", action="store_true", help="seeded requests (batch-invariant forwards)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/lean-forward"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [row for rule in args.rules for row in measure(rule, args)]
    whole = [row for rule in args.rules for row in decodes(rule, args)] if args.batch_sizes else []
    options = " ".join(f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
                       for k, v in vars(args).items() if k not in ("model", "out", "seeded"))
    result = {"command": "python bench/results/lean-forward/ab_forward.py " + options
              + (" --seeded" if args.seeded else ""), "machine": machine(),
        "repeats": args.repeats, "rows": rows, "decodes": whole, "utterances": args.utterances,
        "max_tokens": args.max_tokens, "seeded": args.seeded}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "ab_forward.json", result)
    (args.out / "ab_forward.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
