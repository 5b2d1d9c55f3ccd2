"""What verify costs on the embedded model's own decode steps, rule by rule.

    pcgtts bench verify --model models/demo-en [--batch-sizes 1 6] [--utterances 6] [--reps 15]

verify_speed's main timings use synthetic distributions over Llasa-sized vocabularies; this one times what
the bundle's engine actually verifies. An engine (exact SD, eager) decodes the speech prompts with the decode
constraint on, at each batch size, and keeps every speculative step's (draft tokens [B, γ], draft probs
[B, γ, V], target probs [B, γ+1, V]). Each rule then verifies all kept steps of a batch size; the rules take
turns within every repeat (so the machine's drift hits all alike), and the result is the median over
repeats of the mean time per verify call, with its ratio to exact's, and the drafts each rule accepts per
row and step on those same inputs (mean over rows, steps and repeats, each repeat its own seed): how much
further a rule gets from the very same draft blocks (block vs exact, pcg-block vs pcg).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from pcgtts.asg_tables import ASGTable
from pcgtts.bench.common import batched, bundle_engine, machine, speech_requests, write_json
from pcgtts.engine import Engine
from pcgtts.engine.acceptance import AcceptanceRule, make_rule
from pcgtts.engine.ops import TORCH_OPS
from pcgtts.tts.bundle import ModelBundle

Step = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # draft tokens, draft probs, target probs


def bundle_rules(bundle: ModelBundle) -> dict[str, AcceptanceRule]:
    """The rules `bench acceptance --quick` runs, PCG and PCG-block with the bundle's own table; each rule
    with a compiled form both as the compiled CPU loop (what the engine runs on CPU) and as torch ops (what
    it runs on CUDA)."""
    rules = {"exact": make_rule("exact"), "exact torch ops": make_rule("exact", ops=TORCH_OPS),
             "block": make_rule("block"), "block torch ops": make_rule("block", ops=TORCH_OPS),
             "ssd β=0.2": make_rule("ssd", bias=0.2),
             "top-k k=3": make_rule("topk", k=3)}
    if bundle.asg_table is not None:
        table = ASGTable.load(bundle.asg_table)
        name = table.meta.get("name") or f"θ={float(table.meta['theta']):g}"
        rules[f"pcg {name}"] = make_rule("pcg", table=table)
        rules[f"pcg {name} torch ops"] = make_rule("pcg", table=table, ops=TORCH_OPS)
        rules[f"pcg-block {name}"] = make_rule("pcg-block", table=table)
        rules[f"pcg-block {name} torch ops"] = make_rule("pcg-block", table=table, ops=TORCH_OPS)
    return rules


def exact_engine(bundle: ModelBundle, num_speculative_tokens: int = 3) -> Engine:
    """The engine whose steps are captured: exact SD, eager, on CPU."""
    return bundle_engine(bundle, "exact", num_speculative_tokens=num_speculative_tokens)


def capture_steps(engine: Engine, prompts: list, params: list, batch_size: int) -> list[Step]:
    """Decode the prompts in batches of `batch_size`; the inputs of every speculative step verified at the
    engine's full γ (copies)."""
    decoder = engine.decoder
    kept: list[Step] = []
    original = decoder._verify

    def recording(seqs, row_gammas, sampler, drafts, draft_probs, target_probs):
        if all(g == decoder.num_speculative_tokens for g in row_gammas):
            kept.append((drafts.clone(), draft_probs.clone(), target_probs.clone()))
        return original(seqs, row_gammas, sampler, drafts, draft_probs, target_probs)

    decoder._verify = recording
    try:
        for batch_prompts, batch_params in batched(prompts, params, batch_size):
            engine.generate(batch_prompts, batch_params)
    finally:
        del decoder._verify  # the class's method again
    return kept


def time_rules(rules: dict[str, AcceptanceRule], steps: list[Step], repeats: int) -> dict[str, dict]:
    """Per rule: microseconds per verify call (median over repeats of the mean over `steps`), per-repeat
    values, the ratio of the median to exact's, and the drafts accepted per row and step (mean over every
    verdict of the kept repeats, with its standard error)."""
    runs: dict[str, list[float]] = {name: [] for name in rules}
    accepted: dict[str, list[torch.Tensor]] = {name: [] for name in rules}
    for repeat in range(repeats + 1):  # the first round warms up and is not kept
        for name, rule in rules.items():
            generator = torch.Generator().manual_seed(repeat)
            verdicts = []
            start = time.perf_counter()
            for drafts, draft_probs, target_probs in steps:
                verdicts.append(rule.verify(drafts, draft_probs, target_probs, generator).num_accepted)
            if repeat:
                runs[name].append(1e6 * (time.perf_counter() - start) / len(steps))
                accepted[name] += verdicts
    exact = statistics.median(runs["exact"])
    out = {}
    for name, values in runs.items():
        counts = torch.cat(accepted[name]).double()
        out[name] = {"us_per_verify": round(statistics.median(values), 1),
                     "x_exact": round(statistics.median(values) / exact, 3),
                     "runs": [round(v, 1) for v in values],
                     "accepted_per_row": round(float(counts.mean()), 4),
                     "accepted_per_row_se": round(float(counts.std() / counts.numel() ** 0.5), 4)}
    return out


def run(model: Path, batch_sizes: list[int], utterances: int, max_tokens: int, repeats: int,
        num_speculative_tokens: int = 3,
        temperature: float = 0.8) -> dict:
    bundle = ModelBundle.from_dir(model)
    engine = exact_engine(bundle, num_speculative_tokens)
    prompts, params = speech_requests(bundle, utterances, temperature, max_tokens)
    rules = bundle_rules(bundle)
    rows = []
    for batch_size in batch_sizes:
        steps = capture_steps(engine, prompts, params, batch_size)
        for name, timing in time_rules(rules, steps, repeats).items():
            rows.append({"batch": batch_size, "rule": name, "steps": len(steps), **timing})
    return {"machine": machine(), "num_speculative_tokens": num_speculative_tokens,
            "temperature": temperature, "utterances": utterances, "max_tokens": max_tokens,
            "repeats": repeats, "vocab_size": engine.target.model.cfg.vocab_size, "rows": rows}


def markdown(result: dict) -> str:
    lines = ["| batch | rule | µs per verify (median) | x exact | drafts accepted per row and step (± s.e.) "
             "| verify calls timed |",
             "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['batch']} | {r['rule']} | {r['us_per_verify']:.0f} | {r['x_exact']:.2f}x "
              f"| {r['accepted_per_row']:.3f} ± {r['accepted_per_row_se']:.3f} | {r['steps']} |"
              for r in result["rows"]]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """verify_speed's `--model` mode: writes OUT/verify_bundle.json and prints the table."""
    result = run(args.model, args.batch_sizes, args.utterances, args.max_tokens, args.reps)
    result["command"] = (f"pcgtts bench verify --model {args.model} --batch-sizes "
                         f"{' '.join(map(str, args.batch_sizes))} --utterances {args.utterances} "
                         f"--max-tokens {args.max_tokens} --reps {args.reps} --threads {args.threads}")
    write_json(args.out / "verify_bundle.json", result)
    print(markdown(result))
    return 0
