"""int8 products against fp16 ones, alternating in one engine (issue 32 §2: the forward's products toward the
CPU's arithmetic).

    python bench/results/int8-weights/ab_int8.py --out bench/results/int8-weights

Per rule (target-only, PCG) one engine with `cpu_weights="int8"`; its qkv, o and gate_up projections (and
the feature head's gate_up) hold int8 copies, which are detached for the `fp16` form (the products then are
`--cpu-weights fp16`'s) and attached again for `int8`. Requests are unseeded (the bundle's prompts,
T = 0.8): unseeded steps run outside batch-invariance plans, where the copies apply.

- The products alone (`--product-rows`): the target's projections that hold int8 copies, each applied to
  random inputs of R rows through its fp16 copy and through its int8 copy, `--forward-repeats` rounds
  alternating; where int8 starts to pay is the engine's INT8_MIN_ROWS.
- One forward: at the `--at`-th batched forwards of a decode of `--forward-batches` rows, the same
  forward over the same K/V in each form, `--forward-repeats` times alternating (bench.common
  alternating_forwards): the steadier figure on a shared machine.
- Whole decodes: per batch size, `--utterances` requests decoded in consecutive batches, `--repeats` times
  in each form, the order flipped every repeat; tokens/s of each and the median of the per-repeat ratios.
- `--aa-batch-sizes`: the same whole decodes with the fp16 form on both sides (an A/A run): the spread of
  its per-repeat ratios is what this machine's drift alone gives a whole-decode ratio.

Writes OUT/ab_int8.json and OUT/ab_int8.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
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
from pcgtts.engine import Engine
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle


def int8_switch(engine: Engine) -> dict:
    """{"fp16": detach the engine's int8 copies, "int8": attach them}."""
    copies = [(p, p.int8) for p in engine._projections() if p.int8 is not None]
    assert copies, "no int8 copies: fbgemm does not run here"

    def attach(on: bool) -> None:
        for p, packed in copies:
            p.int8 = packed if on else None

    return {"fp16": lambda: attach(False), "int8": lambda: attach(True)}


def product_times(engine: Engine, rows: list[int], repeats: int) -> list[dict]:
    """Per row count: ms of one pass over the target's int8-holding projections through fp16 and int8."""
    projections = [p for p in engine.target.model.projections() if p.int8 is not None]
    kinds = {"fp16": lambda p, x: torch.ops.quantized.linear_dynamic_fp16(x, p.half),
             "int8": lambda p, x: torch.ops.quantized.linear_dynamic(x, p.int8, True)}
    out = []
    for r in rows:
        inputs = [torch.randn(r, p.in_features) for p in projections]
        times: dict[str, list[float]] = {k: [] for k in kinds}
        for i in range(repeats):
            for kind in kinds if i % 2 == 0 else reversed(kinds):
                start = time.perf_counter()
                for p, x in zip(projections, inputs, strict=True):
                    kinds[kind](p, x)
                times[kind].append(1e3 * (time.perf_counter() - start))
        fp16, int8 = statistics.median(times["fp16"]), statistics.median(times["int8"])
        out.append({"rows": r, "products": len(projections), "fp16_ms": fp16, "int8_ms": int8,
                    "fp16_over_int8": fp16 / int8})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--rules", nargs="+", default=["target-only", "pcg"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 6, 16, 32])
    parser.add_argument("--utterances", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--forward-batches", type=int, nargs="*", default=[6, 16, 32])
    parser.add_argument("--at", type=int, nargs="+", default=[20, 35], help="which batched forwards to time")
    parser.add_argument("--forward-repeats", type=int, default=60)
    parser.add_argument("--product-rows", type=int, nargs="*", default=[1, 2, 3, 4, 6, 8, 16, 32, 64])
    parser.add_argument("--aa-batch-sizes", type=int, nargs="*", default=[],
                        help="whole decodes fp16 against fp16 at these batch sizes (target-only's engine)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/int8-weights"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    bundle = ModelBundle.from_dir(args.model)
    rows, forwards, aa, products = [], [], [], []
    for rule in args.rules:
        engine = bundle_engine(bundle, rule, max_num_seqs=max(args.batch_sizes), cpu_weights="int8")
        prompts, params = speech_requests(bundle, args.utterances, 0.8, args.max_tokens)
        params = [replace(p, seed=None) for p in params]
        engine.generate(*speech_requests(bundle, 2, 0.8, 20))  # warm-up
        forms = int8_switch(engine)
        if rule == args.rules[0]:
            products = product_times(engine, args.product_rows, args.forward_repeats)
        for batch in args.forward_batches:
            for row in alternating_forwards(engine, prompts[:batch], params[:batch], forms, args.at,
                                            args.forward_repeats):
                forwards.append({"rule": rule, **row})
                print(rule, f"{row['rows']} x {row['tokens_per_row']}",
                      f"{1 / row['forms']['int8']['first_over_this']:.3f}", flush=True)
        for batch in args.batch_sizes:
            ab = alternating_decodes(engine, prompts, params, batch, forms, args.repeats)
            rows.append({"rule": rule, "batch": batch, **ab})
            print(rule, batch, f"{ab['ratio_median']:.3f}", [f"{r:.2f}" for r in ab["ratios"]], flush=True)
        for batch in args.aa_batch_sizes if rule == args.rules[0] else ():
            same = {"fp16": forms["fp16"], "fp16 again": forms["fp16"]}
            aa.append({"rule": rule, "batch": batch,
                       **alternating_decodes(engine, prompts, params, batch, same, args.repeats)})
    sizes = " ".join(map(str, args.batch_sizes))
    command = (f"python bench/results/int8-weights/ab_int8.py --rules {' '.join(args.rules)} --batch-sizes "
               f"{sizes} --utterances {args.utterances} --max-tokens {args.max_tokens} "
               f"--repeats {args.repeats} --forward-batches {' '.join(map(str, args.forward_batches))} "
               f"--at {' '.join(map(str, args.at))} --forward-repeats {args.forward_repeats} "
               f"--product-rows {' '.join(map(str, args.product_rows))}"
               + "".join(f" --aa-batch-sizes {' '.join(map(str, args.aa_batch_sizes))}"
                         for _ in args.aa_batch_sizes[:1]))
    m = machine()
    write_json(args.out / "ab_int8.json", {"command": command, "machine": m, "forwards": forwards,
                                           "rows": rows, "aa": aa, "products": products})
    lines = [f"# int8 products against fp16, alternating in one engine (`{command}`)", "",
             f"Machine: {m}. Unseeded requests.", "",
             f"The target's {products[0]['products'] if products else 0} int8-holding products on random "
             f"inputs, ms a pass, medians of {args.forward_repeats} alternating rounds:", "",
             "| rows | fp16 | int8 | fp16 / int8 |", "| --- | --- | --- | --- |",
             *[f"| {p['rows']} | {p['fp16_ms']:.3f} | {p['int8_ms']:.3f} | {p['fp16_over_int8']:.2f}x |"
               for p in products], "",
             f"One batched forward of the target, medians of {args.forward_repeats} alternating runs:", "",
             "| rule | rows x tokens | context | fp16 ms | int8 ms | fp16 / int8 | max abs diff |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for f in forwards:
        fp16, int8 = f["forms"]["fp16"], f["forms"]["int8"]
        lines.append(f"| {f['rule']} | {f['rows']} x {f['tokens_per_row']} | {f['context']} | "
                     f"{fp16['ms']:.2f} | {int8['ms']:.2f} | {int8['first_over_this']:.2f}x | "
                     f"{int8['max_abs_diff']:.2g} |")
    lines += ["", "Whole decodes, tokens/s per repeat:", "",
              "| rule | batch | fp16 | int8 | int8 / fp16, median (per repeat) |",
              "| --- | --- | --- | --- | --- |"]
    for r in rows:
        rates = r["tokens_per_s"]
        each = ", ".join(f"{v:.2f}" for v in r["ratios"])
        lines.append(f"| {r['rule']} | {r['batch']} | {' / '.join(f'{v:.0f}' for v in rates['fp16'])} | "
                     f"{' / '.join(f'{v:.0f}' for v in rates['int8'])} | {r['ratio_median']:.2f}x ({each}) |")
    if aa:
        lines += ["", "A/A: the fp16 form on both sides, whole decodes:", "",
                  "| rule | batch | second / first, median (per repeat) |", "| --- | --- | --- |"]
        lines += [f"| {r['rule']} | {r['batch']} | {r['ratio_median']:.2f}x "
                  f"({', '.join(f'{v:.2f}' for v in r['ratios'])}) |" for r in aa]
    (args.out / "ab_int8.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
