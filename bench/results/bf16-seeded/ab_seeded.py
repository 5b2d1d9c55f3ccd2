"""Seeded steps through the bf16 copies (`--cpu-weights bf16`, the AMX default) against the fp16 copies (what
seeded steps took before), side by side in one process, decode after decode.

    python bench/results/bf16-seeded/ab_seeded.py --repeats 10 --out bench/results/bf16-seeded

Both engines run batch-invariant forwards for seeded requests (`--deterministic seeded`, the default) and
decode the same seeded utterances (`pcgtts bench step`'s prompts), alternating engine by engine and
reversing the order every repeat, so a shared machine's drift hits both alike. Reports per batch size and
rule the tokens/s of each, the per-repeat ratio bf16 / fp16 (median and range), and whether each engine's
seeded tokens at batch equal its own tokens one utterance at a time (the seed promise). Then the target's
forward alone, at 16 rows of 1 and of 4 tokens (a target-only step and a PCG verify at batch 16) and at
one row, under the seeded plan, alternating call by call. Writes OUT/ab_seeded.json and OUT/ab_seeded.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from pcgtts.bench.common import (
    bundle_engine,
    machine,
    speech_requests,
    speedup_cell,
    timed_decode,
    timing_cells,
    write_json,
)
from pcgtts.engine.block_manager import SeqBlocks
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle

WEIGHTS = ("fp16", "bf16")


def forward_seconds(engines: dict, shapes: list[tuple[int, int]], repeats: int, context: int = 200) -> dict:
    """Seconds of the target's forward (and LM head) per (rows, tokens), each engine's under its seeded plan,
    alternating call by call."""
    out = {f"{rows}x{tokens}": {w: [] for w in engines} for rows, tokens in shapes}
    prepared = []
    for w, engine in engines.items():
        engine.decoder._shape(engine.invariance)
        runner = engine.target
        for rows, tokens in shapes:
            states = []
            for _ in range(rows):
                state = SeqBlocks()
                state.ensure(runner.blocks, context + tokens)
                states.append(state)
            ids = torch.zeros(rows, tokens, dtype=torch.long)
            positions = (context + torch.arange(tokens))[None].expand(rows, tokens).contiguous()
            valid = torch.ones(rows, tokens, dtype=torch.bool)
            prepared.append((w, f"{rows}x{tokens}", runner, states, (ids, positions, valid)))
    for i in range(repeats + 3):
        for w, shape, runner, states, (ids, positions, valid) in (prepared if i % 2 else prepared[::-1]):
            tables = runner.block_tables(states, int(positions.max()) + 1)
            start = time.perf_counter()
            runner.logits(runner.forward(ids, positions, valid, tables, states=states))
            if i >= 3:
                out[shape][w].append(time.perf_counter() - start)
    for _, _, runner, states, _ in prepared:
        for state in states:
            state.release(runner.blocks)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rules", nargs="+", default=["target-only", "pcg"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--utterances", type=int, default=16, help="at batch 1: the first 4 of them")
    parser.add_argument("--max-tokens", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--forward-repeats", type=int, default=40)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    bundle = ModelBundle.from_dir(DEFAULT_MODEL_DIR)
    prompts, params = speech_requests(bundle, args.utterances, 0.8, args.max_tokens)
    result = {"command": "python bench/results/bf16-seeded/ab_seeded.py " + " ".join(
        f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
        for k, v in vars(args).items()), "machine": machine(), "decodes": [], "forwards": {}}
    for rule in args.rules:
        engines = {w: bundle_engine(bundle, rule, cpu_weights=w) for w in WEIGHTS}
        plans = {w: engines[w].invariance for w in WEIGHTS}
        print(rule, plans)
        for batch in args.batch_sizes:
            n = args.utterances if batch > 1 else min(4, args.utterances)
            seconds = {w: [] for w in WEIGHTS}
            tokens = {}
            for i in range(args.repeats):
                for w in (WEIGHTS if i % 2 == 0 else WEIGHTS[::-1]):
                    tokens[w], s = timed_decode(engines[w], prompts[:n], params[:n], batch)
                    seconds[w].append(s)
            count = sum(len(t) for t in tokens["bf16"])
            alone = tokens if batch == 1 else {w: timed_decode(engines[w], prompts[:n], params[:n], 1)[0]
                                               for w in WEIGHTS}
            row = {"rule": rule, "batch": batch, "utterances": n, "tokens": count, "seconds": seconds,
                   "tok_s": {w: count / statistics.median(seconds[w]) for w in WEIGHTS},
                   "ratio": speedup_cell(seconds["fp16"], seconds["bf16"]),
                   "seeded_same_alone": {w: tokens[w] == alone[w] for w in WEIGHTS}}
            print(rule, batch, row["tok_s"], row["ratio"], row["seeded_same_alone"])
            result["decodes"].append(row)
        if rule == "target-only":
            shapes = [(16, 1), (16, 4), (1, 1), (1, 4)]
            result["forwards"] = forward_seconds(engines, shapes, args.forward_repeats)
            for shape, times in result["forwards"].items():
                print(shape, {w: round(1e3 * statistics.median(t), 2) for w, t in times.items()})
    write_json(args.out / "ab_seeded.json", result)
    lines = [f"# `{result['command']}`", "", f"Machine: {result['machine']}", "",
             "| rule | batch | tok/s fp16 | tok/s bf16 | bf16 / fp16 (per-repeat range) "
             "| seeded tokens at batch = alone |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in result["decodes"]:
        same = " / ".join(f"{w} {'yes' if r['seeded_same_alone'][w] else 'NO'}" for w in WEIGHTS)
        lines.append(f"| {r['rule']} | {r['batch']} | {r['tok_s']['fp16']:.0f} | {r['tok_s']['bf16']:.0f} | "
                     f"{r['ratio']} | {same} |")
    lines += ["", "Target forward under the seeded plan (rows x tokens, ms, medians, alternating by call):",
              "",
              "| shape | fp16 ms | bf16 ms | fp16 / bf16 (range) |", "| --- | --- | --- | --- |"]
    for shape, times in result["forwards"].items():
        lines.append(f"| {shape} | {timing_cells(times['fp16'], times['bf16'], digits=2)} |")
    (args.out / "ab_seeded.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
