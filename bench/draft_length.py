"""Draft length that follows confidence (engine/draft_length.py) against a fixed γ: tokens per verify step,
per-position acceptance, mean draft length and tokens/s, per rule, setting and batch size, in one run.

A setting is γ:θ[:k] (num_speculative_tokens : draft_confidence [: draft_branches]): 3:0 is the fixed γ = 3
the server runs today; 6:0.6 lets a row verify up to 6 drafts while the draft's top probability at each
drafted position is at least 0.6; 3:0:2 drafts a token tree of 2 branches of 3 (engine/spec_tree.py). Under
`--speculation auto` (the server's load-aware policy, engine/spec_policy.py: per step and batch size the
draft length measured fastest, target-only included) γ may name more lengths the policy may choose, 3+5:0
(γ 3, and 5); the requests are then unseeded, since seeded ones keep γ on every step whatever the policy
says. Speech prompts from the bundle (`bench step`'s: sentence i with seed i, T=0.8), every batch size
decoding the same utterances; engines run round-robin per repeat (a shared machine's drift hits all alike),
medians reported.

    pcgtts bench draft-length --settings 3:0 6:0.5 6:0.7 8:0.8 --batch-sizes 1 6 --repeats 3

Writes OUT/draft_length.json, OUT/draft_length.md and OUT/draft_length.png.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch
from pcgtts.bench.common import batched, bundle_engine, machine, ratio, speech_requests, write_json
from pcgtts.bench.step_speed import run_once
from pcgtts.engine import Engine
from pcgtts.engine.config import CPU_WEIGHTS, DETERMINISTIC_MODES
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR, help="model bundle directory")
    parser.add_argument("--rules", nargs="+", default=["exact", "pcg"])
    parser.add_argument("--settings", nargs="+", default=["3:0", "6:0.5", "6:0.7", "8:0.8"],
                        help="γ:θ[:k] (num_speculative_tokens : draft_confidence [: draft_branches])")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 6])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--max-tokens", type=int, default=300)
    parser.add_argument("--utterances", type=int, default=0, help="default: the largest batch size")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (gpu_check.sh runs it there)")
    parser.add_argument("--cpu-weights", default=None, choices=CPU_WEIGHTS,
                        help="EngineConfig.cpu_weights of every engine (default: its default)")
    parser.add_argument("--deterministic", default=None, choices=DETERMINISTIC_MODES,
                        help="EngineConfig.deterministic of every engine (default: its default; the requests "
                             "are seeded, so off is what unseeded requests get)")
    parser.add_argument("--speculation", default="always", choices=("always", "auto"),
                        help="EngineConfig.speculation of every speculative engine; auto (the server's) "
                             "decodes unseeded requests")
    parser.add_argument("--out", type=Path, default=Path("bench/results/draft-length"))


def parse_setting(text: str) -> tuple[int, float, int, tuple[int, ...]]:
    """γ[+more lengths]:θ[:k] -> (γ, θ, k, the further lengths of speculation_lengths)."""
    gammas, _, rest = text.partition(":")
    theta, _, branches = rest.partition(":")
    gamma, *more = (int(g) for g in gammas.split("+"))
    return gamma, float(theta or 0), int(branches or 1), tuple(more)


def setting_name(gamma: int, lengths: tuple[int, ...]) -> str:
    return "+".join(map(str, (gamma, *lengths)))


def decode(engine: Engine, batches: list[tuple[list, list]]) -> dict:
    """Decode the batches one after another: totals, and drafts verified / accepted per position."""
    before = engine.metrics()
    totals = run_once(engine, batches)
    after = engine.metrics()
    by_length = {g: n - before.steps_by_draft_length.get(g, 0)
                 for g, n in after.steps_by_draft_length.items()}
    drafted = [a - b for a, b in zip(after.spec_drafted_per_position, before.spec_drafted_per_position,
                                     strict=True)]
    accepted = [a - b for a, b in zip(after.spec_accepted_per_position, before.spec_accepted_per_position,
                                           strict=True)]
    return totals | {"drafted_per_position": drafted, "accepted_per_position": accepted,
                     "steps_by_draft_length": by_length}


def run(args) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    bundle = ModelBundle.from_dir(args.model)
    prompts, params = speech_requests(bundle, args.utterances or max(args.batch_sizes), args.temperature,
                                      args.max_tokens)
    auto = args.speculation == "auto"
    if auto:  # the policy chooses for unseeded requests only
        params = [replace(p, seed=None) for p in params]
    requests = {b: batched(prompts, params, b) for b in args.batch_sizes}
    configs = [("target-only", 0, 0.0, 1, ())] + [(rule, *parse_setting(s)) for rule in args.rules
                                                  for s in args.settings]
    if not auto and any(c[4] for c in configs):
        raise SystemExit("settings with more draft lengths (γ+γ') need --speculation auto")
    engines = {}
    for rule, gamma, theta, branches, lengths in configs:
        engine = bundle_engine(bundle, rule, num_speculative_tokens=gamma or 1, draft_confidence=theta,
                               draft_branches=branches, device=args.device, cpu_weights=args.cpu_weights,
                               deterministic=args.deterministic, speculation=args.speculation,
                               speculation_lengths=lengths)
        engine.generate(*speech_requests(bundle, 1, args.temperature, 20))  # warm-up
        engines[(rule, gamma, theta, branches, lengths)] = engine
    runs: dict[tuple, list[dict]] = {}
    for r in range(args.repeats):
        for b in args.batch_sizes:
            for key, engine in engines.items():
                res = decode(engine, requests[b])
                runs.setdefault((*key, b), []).append(res)
                print(f"repeat {r + 1}/{args.repeats} batch {b} {key}: {res['tokens_per_s']:.0f} tok/s, "
                      f"{res['tokens_per_verify_step']:.2f} tokens per verify step", flush=True)
    rows = []
    for (rule, gamma, theta, branches, lengths, b), results in runs.items():
        row = {"rule": rule, "num_speculative_tokens": gamma, "speculation_lengths": list(lengths),
               "draft_confidence": theta, "draft_branches": branches, "batch": b,
               "tokens_per_s": statistics.median(x["tokens_per_s"] for x in results),
               "tokens_per_s_runs": [x["tokens_per_s"] for x in results]}
        # counts are the same kind of quantity in every repeat: pool them
        pooled = {k: sum(x[k] for x in results) for k in ("tokens", "steps", "drafted", "accepted")}
        row["tokens_per_verify_step"] = pooled["tokens"] / pooled["steps"]
        row["acceptance_rate"] = ratio(pooled["accepted"], pooled["drafted"])
        drafted = [sum(col) for col in zip(*(x["drafted_per_position"] for x in results), strict=True)]
        accepted = [sum(col) for col in zip(*(x["accepted_per_position"] for x in results), strict=True)]
        # drafted[0]: the (row, step) pairs that drafted at all
        row["mean_draft_length"] = ratio(sum(drafted), drafted[0]) if drafted else None
        # of the rows that drafted position i, the share whose drafts 1..i were all accepted
        row["acceptance_by_position"] = [ratio(a, d) for a, d in zip(accepted, drafted, strict=True)]
        row["drafted_per_position"] = drafted
        steps = {}
        for x in results:
            for g, n in x["steps_by_draft_length"].items():
                steps[g] = steps.get(g, 0) + n
        row["steps_by_draft_length"] = dict(sorted(steps.items()))
        rows.append(row)
    for row in rows:
        base = next(x for x in rows if x["rule"] == "target-only" and x["batch"] == row["batch"])
        row["speedup"] = row["tokens_per_s"] / base["tokens_per_s"]
        # the speed-up of each repeat against target-only in the same repeat, then their median
        row["speedup_runs"] = [a / t for a, t in zip(row["tokens_per_s_runs"], base["tokens_per_s_runs"],
                                                     strict=True)]
        row["speedup_median_of_runs"] = statistics.median(row["speedup_runs"])
    command = ("pcgtts bench draft-length " + " ".join(sys.argv[sys.argv.index("draft-length") + 1:])
               if "draft-length" in sys.argv else " ".join(sys.argv))
    return {"command": command, "machine": machine(), "speculation": args.speculation,
            "temperature": args.temperature,
            "max_tokens": args.max_tokens, "utterances": len(prompts), "repeats": args.repeats, "rows": rows}


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"# Draft length that follows confidence (`{result['command']}`)", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} with {m['torch_threads']} "
             "thread(s). "
             f"T={result['temperature']}, {result['utterances']} utterances per batch size, medians of "
             f"{result['repeats']} round-robin repeats (speed-up: median of per-repeat ratios); speculation "
             f"policy {result.get('speculation', 'always')}.", "",
             "| batch | rule | γ | θ | k | tokens/verify step | mean draft length | acceptance by position "
             "| tokens/s | speed-up | steps by draft length |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    fmt = lambda x, f: "—" if x is None else format(x, f)  # noqa: E731
    for r in sorted(result["rows"], key=lambda r: (r["batch"], r["rule"] != "target-only", r["rule"],
                                                   r["num_speculative_tokens"], r["draft_confidence"],
                                                   r.get("draft_branches", 1))):
        by_position = " ".join(fmt(a, ".2f") for a in r["acceptance_by_position"])
        gammas = setting_name(r["num_speculative_tokens"], tuple(r.get("speculation_lengths", ())))
        steps = " ".join(f"{g}: {n}" for g, n in r.get("steps_by_draft_length", {}).items())
        lines.append(f"| {r['batch']} | {r['rule']} | {gammas} | "
                     f"{r['draft_confidence']} | {r.get('draft_branches', 1)} | "
                     f"{r['tokens_per_verify_step']:.2f} | {fmt(r['mean_draft_length'], '.2f')} | "
                     f"{by_position or '—'} | {r['tokens_per_s']:.0f} | {r['speedup_median_of_runs']:.2f}x | "
                     f"{steps or '—'} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["rule"] != "target-only" and r["batch"] == min(
        x["batch"] for x in result["rows"])]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for r in rows:
        gammas = setting_name(r["num_speculative_tokens"], tuple(r.get("speculation_lengths", ())))
        label = (f"{r['rule']} γ={gammas} θ={r['draft_confidence']} "
                 f"k={r.get('draft_branches', 1)}")
        acc = [a for a in r["acceptance_by_position"] if a is not None]
        left.plot(range(1, len(acc) + 1), acc, marker="o", label=label)
    left.set(xlabel="draft position", ylabel="P(accepted | drafted)", title="per-position acceptance")
    left.legend(fontsize=7)
    names = [setting_name(r["num_speculative_tokens"], tuple(r.get("speculation_lengths", ()))) for r in rows]
    labels = [f"{r['rule']}\n{name}:{r['draft_confidence']}:"
              f"{r.get('draft_branches', 1)}" for r, name in zip(rows, names, strict=True)]
    right.bar(range(len(rows)), [r["tokens_per_verify_step"] for r in rows])
    right.set_xticks(range(len(rows)), labels, fontsize=7)
    right.set(ylabel="tokens per verify step", title="tokens per verify step (γ:θ:k)")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def main(args) -> None:
    result = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "draft_length.json", result)
    (args.out / "draft_length.md").write_text(markdown(result))
    plot(result, args.out / "draft_length.png")
    print(markdown(result))
