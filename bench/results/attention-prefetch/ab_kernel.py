"""The rows' attention kernel of a git revision against this checkout's, side by side in one engine.

    python bench/results/attention-prefetch/ab_kernel.py --base 2e67a7e --rules target-only pcg \
        --batch-sizes 1 6 16 --repeats 4 --out bench/results/attention-prefetch

Compiles `_attend_rows` from `git show BASE:engine/ops/row_attention.py` with the checkout's flags, builds
one engine per rule and, for each batch size and seeded / unseeded requests, decodes the same utterances
(`--utterances`, in consecutive batches of that size, as `pcgtts bench step` does) with the two kernels in
turn, repeat after repeat (machine drift hits both alike). Reports tokens/s per repeat and the share of
wall time inside the attention kernel; checks that both kernels decode the same tokens (seeded requests).
Then, less exposed to the machine's drift than whole decodes: every `--record-every`-th attention call of
one unseeded decode at the largest batch is recorded (its inputs copied), and both kernels are timed on
those same calls, alternating call by call, `--kernel-repeats` times; their outputs are compared bit for bit.
Writes OUT/ab_kernel.json and OUT/ab_kernel.md.
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from numba import njit
from pcgtts.bench.common import (
    bundle_engine,
    machine,
    speech_requests,
    timed_decode,
    timing_cells,
    write_json,
)
from pcgtts.engine.ops import kernel, row_attention
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle


def base_kernel(revision: str):
    """`_attend_rows` as it was at `revision`, compiled here."""
    source = subprocess.run(["git", "show", f"{revision}:engine/ops/row_attention.py"], check=True,
                            capture_output=True, text=True).stdout
    body = source[source.index("@cpu_kernel([_signature"):source.index("def _no_gaps")]
    body = body[body.index("def _attend_rows"):]
    names = dict(vars(row_attention))
    names.update(np=np, math=math, as_float32=kernel.as_float32)
    exec(compile(body, f"{revision}:engine/ops/row_attention.py", "exec"), names)
    return njit(nogil=True, fastmath=set(kernel.REASSOCIATE))(names["_attend_rows"])


class KernelClock:
    """Seconds spent in the compiled attention call, wrapped around ROW_ATTENTION.compiled."""

    def __init__(self):
        self.seconds = 0.0
        inner = row_attention.attend_rows_compiled

        def timed(*args):
            start = time.perf_counter()
            try:
                return inner(*args)
            finally:
                self.seconds += time.perf_counter() - start

        object.__setattr__(row_attention.ROW_ATTENTION, "compiled", timed)


def record_calls(engine, prompts, params, every: int) -> list[tuple]:
    """Copies of the inputs of every `every`-th compiled attention call of one decode."""
    calls, seen = [], [0]
    inner = row_attention.ROW_ATTENTION.compiled

    def recording(q, keys, values, rows, positions, gaps=None):
        if seen[0] % every == 0:
            gaps = row_attention._no_gaps(positions) if gaps is None else gaps
            calls.append((q.contiguous().numpy().copy(), row_attention._kernel_view(keys).copy(),
                          row_attention._kernel_view(values).copy(), rows.numpy().copy(),
                          positions.contiguous().numpy().copy(), gaps.contiguous().numpy().copy()))
        seen[0] += 1
        return inner(q, keys, values, rows, positions, gaps)

    object.__setattr__(row_attention.ROW_ATTENTION, "compiled", recording)
    try:
        engine.generate(prompts, params)
    finally:
        object.__setattr__(row_attention.ROW_ATTENTION, "compiled", inner)
    return calls


def time_kernels(kernels: dict, calls: list[tuple], repeats: int) -> dict:
    """Seconds per repeat of each kernel over all recorded calls (alternating call by call), and whether
    their outputs agree bit for bit."""
    seconds = {name: [0.0] * repeats for name in kernels}
    same = True
    for i in range(repeats):
        for q, keys, values, rows, positions, gaps in calls:
            outs = {}
            for name, fn in (kernels.items() if i % 2 == 0 else reversed(kernels.items())):
                out = np.empty(q.shape, np.float32)
                start = time.perf_counter()
                fn(q, keys, values, rows, positions, gaps, out)
                seconds[name][i] += time.perf_counter() - start
                outs[name] = out
            same = same and all(np.array_equal(outs["base"], o) for o in outs.values())
    return {"seconds": seconds, "same_bits": same}


def same_tokens(same: bool | None) -> str:
    return "—" if same is None else "yes" if same else "NO"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True)
    parser.add_argument("--rules", nargs="+", default=["target-only", "pcg"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 6, 16])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--utterances", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--record-every", type=int, default=20)
    parser.add_argument("--kernel-repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the server's CPU default)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kernels = {"base": base_kernel(args.base), "this": row_attention._attend_rows}
    clock = KernelClock()
    bundle = ModelBundle.from_dir(DEFAULT_MODEL_DIR)
    seeded_params = speech_requests(bundle, args.utterances, 0.8, args.max_tokens)
    rows, recorded = [], []
    for rule in args.rules:
        engine = bundle_engine(bundle, rule, max_num_seqs=max(args.batch_sizes))
        for fn in kernels.values():
            row_attention._attend_rows = fn
            engine.generate(*speech_requests(bundle, 2, 0.8, 20))  # warm-up
        row_attention._attend_rows = kernels["this"]
        prompts, params = seeded_params
        batch = max(args.batch_sizes)
        calls = record_calls(engine, prompts[:batch], [replace(p, seed=None) for p in params[:batch]],
                             args.record_every)
        timing = time_kernels(kernels, calls, args.kernel_repeats)
        recorded.append({"rule": rule, "batch": batch, "calls": len(calls),
                         "query_tokens": sorted({c[0].shape[1] for c in calls}), **timing})
        base, this = timing["seconds"]["base"], timing["seconds"]["this"]
        print(rule, "recorded", len(calls), "calls: base/this per repeat",
              " ".join(f"{b / t:.2f}" for b, t in zip(base, this, strict=True)), timing["same_bits"],
              flush=True)
        del calls
        for seeded in (False, True):
            prompts, params = seeded_params
            params = params if seeded else [replace(p, seed=None) for p in params]
            for batch in args.batch_sizes:
                runs = {name: [] for name in kernels}
                outputs = {}
                for _ in range(args.repeats):
                    for name, fn in kernels.items():
                        row_attention._attend_rows = fn
                        clock.seconds = 0.0
                        tokens, wall = timed_decode(engine, prompts, params, batch)
                        outputs[name] = tokens
                        runs[name].append({"tokens_per_s": sum(map(len, tokens)) / wall,
                                           "attention_share": clock.seconds / wall})
                row = {"rule": rule, "seeded": seeded, "batch": batch, "runs": runs,
                       "same_tokens": outputs["base"] == outputs["this"] if seeded else None,
                       "ratio_per_repeat": [t["tokens_per_s"] / b["tokens_per_s"]
                                            for t, b in zip(runs["this"], runs["base"], strict=True)]}
                rows.append(row)
                print(rule, "seeded" if seeded else "unseeded", batch,
                      " ".join(f"{r:.2f}" for r in row["ratio_per_repeat"]), row["same_tokens"], flush=True)
    row_attention._attend_rows = kernels["this"]
    result = {"command": "python bench/results/attention-prefetch/ab_kernel.py " + " ".join(
        f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
        for k, v in vars(args).items()), "machine": machine(), "rows": rows, "recorded": recorded}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "ab_kernel.json", result)
    lines = [f"# `{result['command']}`", "", f"Machine: {result['machine']}", "",
             "| rule | requests | batch | tok/s base | tok/s this | this / base (per repeat) "
             "| attention share base → this | same tokens |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        med = {n: statistics.median(x["tokens_per_s"] for x in r["runs"][n]) for n in kernels}
        share = {n: statistics.median(x["attention_share"] for x in r["runs"][n]) for n in kernels}
        per = ", ".join(f"{x:.2f}" for x in r["ratio_per_repeat"])
        lines.append(f"| {r['rule']} | {'seeded' if r['seeded'] else 'unseeded'} | {r['batch']} | "
                     f"{med['base']:.0f} | {med['this']:.0f} | "
                     f"{statistics.median(r['ratio_per_repeat']):.2f}x "
                     f"({per}) | {share['base']:.2f} → {share['this']:.2f} | "
                     f"{same_tokens(r['same_tokens'])} |")
    lines += ["", "Recorded calls (one unseeded decode at the largest batch), both kernels on one input:",
              "", "| rule | batch | calls | query tokens | ms base | ms this | base / this (per repeat) "
              "| same bits |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in recorded:
        base, this = r["seconds"]["base"], r["seconds"]["this"]
        lines.append(f"| {r['rule']} | {r['batch']} | {r['calls']} | {r['query_tokens']} | "
                     f"{timing_cells(base, this)} | {'yes' if r['same_bits'] else 'NO'} |")
    (args.out / "ab_kernel.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
