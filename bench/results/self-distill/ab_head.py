"""The draft head before and after its fine-tuning on the target's own samples (stage self_distill), side by
side with target-only, in one process.

    python bench/results/self-distill/ab_head.py --before HEAD_DIR --batch-sizes 1 6 16 --repeats 3 \
        --out bench/results/self-distill

Three engines over the bundle's target: target-only, PCG with the `--before` head (e.g. the previous
build's `models/demo-en/draft-head`, checked out apart) and PCG with the bundle's head. Per batch size the
bundle's speech prompts (`--utterances`, T as given, seeded) are decoded by each engine in turn, the order
rotated every repeat (a shared machine drifts by more than the change between runs minutes apart), after one
untimed decode each. Reports per engine and batch size: tokens/s per repeat, tokens per verify step,
acceptance, and per repeat the speed-up over target-only in the same repeat.
Writes OUT/ab_head.json and OUT/ab_head.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from pcgtts.bench.common import DecodeTally, batched, bundle_engine, machine, speech_requests, write_json
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle


def decode(engine, prompts, params, batch_size) -> tuple[DecodeTally, float, float]:
    """The decode's tally, wall seconds and this thread's CPU seconds (torch runs on it alone: one intra-op
    thread; CPU time leaves out what other tenants of a shared VM take, wall time does not)."""
    start, cpu = time.perf_counter(), time.thread_time()
    gens = [g for p, s in batched(prompts, params, batch_size) for g in engine.generate(p, s)]
    return DecodeTally.of(gens), time.perf_counter() - start, time.thread_time() - cpu


def tokens_per_step_by_length(bundle, heads: dict[str, Path], rule: str, lengths: list[int],
                              temperatures: list[float], utterances: int, max_tokens: int) -> list[dict]:
    """Tokens per verify step and acceptance of each head at each draft length and temperature: the bundle's
    prompts decoded seeded at batch 16 (counts, not times: the same on any machine with these products)."""
    rows = []
    for gamma in lengths:
        for name, head in heads.items():
            engine = bundle_engine(bundle, rule, num_speculative_tokens=gamma, draft_dir=head)
            for temperature in temperatures:
                prompts, params = speech_requests(bundle, utterances, temperature, max_tokens)
                tally, _, _ = decode(engine, prompts, params, 16)
                rows.append({"num_speculative_tokens": gamma, "head": name, "temperature": temperature,
                             **tally.fields()})
                print(f"γ {gamma} {name} T={temperature}: {tally.tokens_per_verify_step:.2f} tokens per "
                      f"verify step, acceptance {tally.acceptance_rate:.3f}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--before", type=Path, required=True, help="the head to compare with (a directory)")
    parser.add_argument("--rule", default="pcg")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 6, 16])
    parser.add_argument("--utterances", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--lengths", type=int, nargs="*", default=[],
                        help="draft lengths at which to count tokens per verify step of both heads")
    parser.add_argument("--length-temperatures", type=float, nargs="+", default=[0.8, 0.5])
    parser.add_argument("--length-utterances", type=int, default=48)
    parser.add_argument("--out", type=Path, default=Path("bench/results/self-distill"))
    args = parser.parse_args()

    bundle = ModelBundle.from_dir(args.model)
    heads = {"before": args.before, "after": bundle.draft_dir}
    by_length = tokens_per_step_by_length(bundle, heads, args.rule, args.lengths, args.length_temperatures,
                                          args.length_utterances, args.max_tokens)
    engines = {"target-only": bundle_engine(bundle, "target-only"),
               "before": bundle_engine(bundle, args.rule, draft_dir=args.before),
               "after": bundle_engine(bundle, args.rule)}
    names = list(engines)
    prompts, params = speech_requests(bundle, args.utterances, args.temperature, args.max_tokens)
    rows = []
    for batch_size in args.batch_sizes:
        rates: dict[str, list[float]] = {n: [] for n in names}
        cpu_rates: dict[str, list[float]] = {n: [] for n in names}
        tallies: dict[str, DecodeTally] = {}
        for name in names:  # untimed: a batch size's first decode pays one-time costs
            decode(engines[name], prompts[:batch_size], params[:batch_size], batch_size)
        for repeat in range(args.repeats):
            for name in names[repeat % 3:] + names[:repeat % 3]:
                tally, seconds, cpu_seconds = decode(engines[name], prompts, params, batch_size)
                rates[name].append(tally.tokens / seconds)
                cpu_rates[name].append(tally.tokens / cpu_seconds)
                tallies[name] = tally  # seeded: the same tokens every repeat
        for name in names:
            speedups = [r / b for r, b in zip(rates[name], rates["target-only"], strict=True)]
            cpu_speedups = [r / b for r, b in zip(cpu_rates[name], cpu_rates["target-only"], strict=True)]
            rows.append({"batch_size": batch_size, "engine": name, "tokens_per_s": rates[name],
                         "tokens_per_s_median": statistics.median(rates[name]),
                         "speedup_per_repeat": speedups, "speedup_median": statistics.median(speedups),
                         "tokens_per_cpu_s": cpu_rates[name], "cpu_speedup_per_repeat": cpu_speedups,
                         "cpu_speedup_median": statistics.median(cpu_speedups), **tallies[name].fields()})
        print(f"batch {batch_size}: " + ", ".join(
            f"{r['engine']} {r['tokens_per_s_median']:.0f} tok/s ({r['speedup_median']:.2f}x, CPU time "
            f"{r['cpu_speedup_median']:.2f}x, "
            f"{r['tokens_per_verify_step']:.2f} tok/step)" for r in rows[-3:]), flush=True)
    command = ("python bench/results/self-distill/ab_head.py --before " + args.before.name +
               f" --rule {args.rule} --batch-sizes {' '.join(map(str, args.batch_sizes))} --utterances "
               f"{args.utterances} --repeats {args.repeats} --temperature {args.temperature} --max-tokens "
               f"{args.max_tokens}" + (f" --lengths {' '.join(map(str, args.lengths))} --length-temperatures "
                                       f"{' '.join(map(str, args.length_temperatures))} --length-utterances "
                                       f"{args.length_utterances}" if args.lengths else ""))
    write_json(args.out / "ab_head.json", {"command": command, "machine": machine(), "rows": rows,
                                          "by_length": by_length})
    lines = [f"`{command}`", "", "| batch | engine | tok/s per repeat | speed-up over target-only, median "
             "(per repeat) | the same by CPU time | tokens per verify step | acceptance |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        per = ", ".join(f"{x:.0f}" for x in r["tokens_per_s"])
        spread = ", ".join(f"{x:.2f}" for x in r["speedup_per_repeat"])
        cpu_spread = ", ".join(f"{x:.2f}" for x in r["cpu_speedup_per_repeat"])
        tpv = "" if r["engine"] == "target-only" else f"{r['tokens_per_verify_step']:.2f}"
        acc = "" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.3f}"
        lines.append(f"| {r['batch_size']} | {r['engine']} | {per} | {r['speedup_median']:.2f}x ({spread}) "
                     f"| {r['cpu_speedup_median']:.2f}x ({cpu_spread}) | {tpv} | {acc} |")
    if by_length:
        lines += ["", "Tokens per verify step (acceptance) by draft length, seeded, batch 16:", "",
                  "| draft length | temperature | before | after |", "| --- | --- | --- | --- |"]
        for gamma in args.lengths:
            for temperature in args.length_temperatures:
                cell = {r["head"]: f"{r['tokens_per_verify_step']:.2f} ({r['acceptance_rate']:.3f})"
                        for r in by_length if r["num_speculative_tokens"] == gamma
                        and r["temperature"] == temperature}
                lines.append(f"| {gamma} | {temperature} | {cell['before']} | {cell['after']} |")
    (args.out / "ab_head.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
