"""The engine's decodes at one and two torch threads, alternating in one engine (issue 32 §2: may the engine
take the second core?).

    python bench/results/lean-forward/threads_ab.py --out bench/results/lean-forward

Per rule (target-only, PCG) and batch size: `--utterances` unseeded requests (the bundle's prompts, T = 0.8)
decoded in consecutive batches, `--repeats` times at each thread count, the order flipped every repeat;
tokens/s of each and the median of the per-repeat ratios. The server's codec runs in a process of its own
and takes the second core's time under load, so this is the most a second engine thread could give.
Writes OUT/threads_ab.json and OUT/threads_ab.md.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch
from pcgtts.bench.common import (
    alternating_decodes,
    bundle_engine,
    machine,
    speech_requests,
    write_json,
)
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 6, 16])
    parser.add_argument("--utterances", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("bench/results/lean-forward"))
    args = parser.parse_args()
    bundle = ModelBundle.from_dir(args.model)
    rows = []
    for rule in ("target-only", "pcg"):
        engine = bundle_engine(bundle, rule, max_num_seqs=max(args.batch_sizes))
        prompts, params = speech_requests(bundle, args.utterances, 0.8, args.max_tokens)
        params = [replace(p, seed=None) for p in params]
        for batch in args.batch_sizes:
            torch.set_num_threads(1)
            threads = {"1": partial(torch.set_num_threads, 1), "2": partial(torch.set_num_threads, 2)}
            ab = alternating_decodes(engine, prompts, params, batch, threads, args.repeats)
            rates = ab["tokens_per_s"]
            rows.append({"rule": rule, "batch": batch, "one_thread_tokens_per_s": rates["1"],
                         "two_threads_tokens_per_s": rates["2"], "ratio_median": ab["ratio_median"],
                         "ratios": ab["ratios"]})
            print(rule, batch, f"{ab['ratio_median']:.3f}", flush=True)
    sizes = " ".join(map(str, args.batch_sizes))
    command = (f"python bench/results/lean-forward/threads_ab.py --batch-sizes {sizes}"
               f" --utterances {args.utterances} --max-tokens {args.max_tokens} --repeats {args.repeats}")
    write_json(args.out / "threads_ab.json", {"command": command, "machine": machine(), "rows": rows})
    lines = [f"# One and two torch threads, alternating (`{command}`)", "",
             f"Machine: {machine()}. Unseeded, tokens/s per repeat.", "",
             "| rule | batch | 1 thread | 2 threads | 2 / 1, median (per repeat) |",
             "| --- | --- | --- | --- | --- |"]
    for r in rows:
        one = " / ".join(f"{v:.0f}" for v in r["one_thread_tokens_per_s"])
        two = " / ".join(f"{v:.0f}" for v in r["two_threads_tokens_per_s"])
        each = ", ".join(f"{v:.2f}" for v in r["ratios"])
        lines.append(f"| {r['rule']} | {r['batch']} | {one} | {two} | {r['ratio_median']:.2f}x ({each}) |")
    (args.out / "threads_ab.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
