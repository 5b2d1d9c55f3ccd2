"""Decode speed side by side: target-only, exact SD, block verification, PCG and PCG-block (`--rules`), eager
and with captured decode graphs, plus the forward costs that bound speculation (Leviathan et al.: speed-up
<= (1 - α^{γ+1}) / ((1 - α)(γc + v))).

Speech prompts from the bundle's family and voices (the acceptance sweep's sentences), T=0.8, seeds fixed.
Every batch size decodes the same `--utterances` prompts (sentence i with seed i), in consecutive batches of
that size: batch 1 decodes them one after another, so its speed-ups average over as many sample paths as
the larger batches do instead of resting on one utterance's.
For every decode-graph mode (`--graphs`) it builds one engine per rule, then runs the repeats round-robin
(every configuration once per repeat, so drift of a shared machine hits all alike) and reports medians.
Forward costs come from the same engines: c = draft forward (1 token) / target forward (1 token),
v = target forward on γ+1 tokens / target forward on 1, both at batch 1 over a `--context`-token cache,
each forward timed as the mean of γ in a row (as a step runs the draft).

    pcgtts bench step --graphs eager compile --batch-sizes 1 6 --repeats 3 --out bench/results

Writes OUT/step_speed.json, OUT/step_speed.png and OUT/step_speed.md (command, machine, table).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from pcgtts.bench.common import DecodeTally, batched, bundle_engine, machine, speech_requests, write_json
from pcgtts.engine import Engine
from pcgtts.engine.block_manager import SeqBlocks
from pcgtts.engine.config import CPU_ATTENTION, CPU_KV, CPU_WEIGHTS
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle

RULES = ("target-only", "exact", "block", "pcg", "pcg-block")
KV_SETTINGS = tuple(f"kv:{k}" for k in CPU_KV)  # --graphs' names of the CPU K/V stores


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR, help="model bundle directory")
    parser.add_argument("--draft", type=Path, default=None,
                        help="draft directory (a Llama checkpoint or a feature head) instead of the bundle's")
    parser.add_argument("--graphs", nargs="+", default=["eager", "compile"],
                        help="decode_graphs modes to compare (eager, compile, cuda_graphs), each optionally "
                             "+ a deterministic mode (EngineConfig.deterministic: seeded, always, off), e.g. "
                             "eager+off for forwards that are not batch-invariant; and optionally "
                             "/ a CPU attention (EngineConfig.cpu_attention: rows, sdpa) and / the CPU "
                             "weights (EngineConfig.cpu_weights: auto, fp16, fp32, bf16, int8) and / kv: the "
                             "CPU K/V store (EngineConfig.cpu_kv: kv:fp16, kv:fp32), "
                             "e.g. eager/sdpa/fp32/kv:fp32")
    parser.add_argument("--rules", nargs="+", default=["target-only", "exact", "pcg"],
                        help=f"of {', '.join(RULES)}")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 6])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-speculative-tokens", type=int, default=3, help="draft tokens per step (γ)")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--max-tokens", type=int, default=400, help="cap on generated tokens per utterance")
    parser.add_argument("--utterances", type=int, default=0,
                        help="prompts every batch size decodes, in batches of its size (default: the largest "
                             "batch size)")
    parser.add_argument("--context", type=int, default=300, help="cached tokens for the forward timings")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--compile-cache-dir", type=Path, default=None,
                        help="inductor cache (default: EngineConfig's)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (the server's CPU default is 1; 0 = torch's default)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))


def run_once(engine: Engine, batches: list[tuple[list, list]]) -> dict:
    """Decode the batches one after another; totals over all of them."""
    start = time.perf_counter()
    gens = [g for prompts, params in batches for g in engine.generate(prompts, params)]
    wall = time.perf_counter() - start
    tally = DecodeTally.of(gens)
    return {"wall_s": wall, "tokens_per_s": tally.tokens / wall, **tally.fields()}


def head_step(engine: Engine):
    """One feature-head draft step at batch 1 (the head, then the target's LM head), as a call."""
    state = torch.zeros(1, engine.target_config.hidden_size, device=engine.device, dtype=engine.dtype)
    token = torch.zeros(1, dtype=torch.long, device=engine.device)
    return lambda: engine.target.logits(engine.head(state, token)[:, None])


def forward_costs(shapes: dict[str, tuple], context: int, reps: int = 40, consecutive: int = 1
                  ) -> dict[str, float]:
    """Median ms of one decode forward per named (runner, tokens per row), or per named call (a feature-head
    draft step), at batch 1 over `context` cached
    tokens (through the runner's captured graph when it has one for that shape), the shapes timed in turn
    within each repeat so that a shared machine's drift hits all alike. Writes scratch positions only.
    Each shape runs `consecutive` forwards in a row per repeat and counts their mean, as a decode step runs
    the draft γ times in a row: the first of them finds its weights evicted by the other model's forward,
    the others do not. Passes the row's state, as the engine does, so an eager CPU forward reads its KV
    mirror (after the first call) rather than gathering the context from the pool."""
    prepared = {}
    for name, shape in shapes.items():
        if callable(shape):  # a draft without a cache of its own: the call itself
            prepared[name] = (None, None, shape)
            continue
        runner, num_tokens = shape
        state = SeqBlocks()
        state.ensure(runner.blocks, context + num_tokens)
        dev = runner.device
        ids = torch.zeros(1, num_tokens, dtype=torch.long, device=dev)
        positions = (context + torch.arange(num_tokens, device=dev))[None]
        valid = torch.ones(1, num_tokens, dtype=torch.bool, device=dev)
        prepared[name] = (runner, state, (ids, positions, valid,
                                          runner.block_tables([state], context + num_tokens)))
    times: dict[str, list[float]] = {name: [] for name in shapes}
    try:
        for i in range(reps + 3):
            for name, (runner, state, inputs) in prepared.items():
                t0 = time.perf_counter()
                for _ in range(consecutive):
                    if runner is None:
                        inputs()
                    else:
                        runner.logits(runner.forward(*inputs, states=[state]))
                if i >= 3:
                    times[name].append((time.perf_counter() - t0) / consecutive)
    finally:
        for runner, state, _ in prepared.values():
            if runner is not None:
                state.release(runner.blocks)
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


def leviathan_bound(alpha: float, gamma: int, c: float, v: float) -> float:
    """Expected speed-up over target-only with per-token acceptance α, draft cost c and verify cost v."""
    tokens = (1 - alpha ** (gamma + 1)) / (1 - alpha) if alpha < 1 else gamma + 1
    return tokens / (gamma * c + v)


def run(args) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    bundle = ModelBundle.from_dir(args.model, draft_dir=args.draft)
    prompts, params = speech_requests(bundle, args.utterances or max(args.batch_sizes), args.temperature,
                                      args.max_tokens)
    requests = {b: batched(prompts, params, b) for b in args.batch_sizes}
    engines, start_up = {}, {}
    for graphs in args.graphs:
        for rule in args.rules:
            t0 = time.perf_counter()
            mode, *settings = graphs.split("/")  # e.g. "eager+off/sdpa/fp32"
            unknown = [s for s in settings if s not in CPU_ATTENTION + CPU_WEIGHTS + KV_SETTINGS]
            if unknown:
                raise SystemExit(f"--graphs {graphs}: unknown setting {unknown[0]!r} (CPU attention "
                                 f"{', '.join(CPU_ATTENTION)}; CPU weights {', '.join(CPU_WEIGHTS)}; CPU K/V "
                                 f"{', '.join(KV_SETTINGS)})")
            mode, _, deterministic = mode.partition("+")
            engine = bundle_engine(bundle, rule, num_speculative_tokens=args.num_speculative_tokens,
                                   decode_graphs=mode, deterministic=deterministic or None,
                                   cpu_attention=next((s for s in settings if s in CPU_ATTENTION), None),
                                   cpu_weights=next((s for s in settings if s in CPU_WEIGHTS), None),
                                   cpu_kv=next((s[3:] for s in settings if s in KV_SETTINGS), None),
                                   device=args.device, dtype=args.dtype,
                                   compile_cache_dir=args.compile_cache_dir)
            start_up[f"{graphs}/{rule}"] = {"seconds": time.perf_counter() - t0,
                                            "capture_seconds": engine.capture_seconds}
            engine.generate(*speech_requests(bundle, 1, args.temperature, 20))  # warm-up
            engines[(graphs, rule)] = engine
            print(f"built {graphs}/{rule} in {time.perf_counter() - t0:.1f} s", flush=True)
    runs: dict[tuple, list[dict]] = {}
    for r in range(args.repeats):
        for b in args.batch_sizes:
            for (graphs, rule), engine in engines.items():
                res = run_once(engine, requests[b])
                runs.setdefault((graphs, rule, b), []).append(res)
                print(f"repeat {r + 1}/{args.repeats} batch {b} {graphs}/{rule}: "
                      f"{res['tokens_per_s']:.0f} tok/s", flush=True)
    rows = []
    for (graphs, rule, b), results in runs.items():
        med = {k: statistics.median(x[k] for x in results) if results[0][k] is not None else None
               for k in ("tokens_per_s", "acceptance_rate", "tokens_per_verify_step", "wall_s")}
        rows.append({"graphs": graphs, "rule": rule, "batch": b, **med,
                     "tokens_per_s_runs": [x["tokens_per_s"] for x in results]})
    for row in rows:
        base = next(x for x in rows if x["graphs"] == row["graphs"] and x["batch"] == row["batch"]
                    and x["rule"] == "target-only") if "target-only" in args.rules else None
        row["speedup"] = row["tokens_per_s"] / base["tokens_per_s"] if base else None
    costs = {}
    for graphs in args.graphs:
        spec = engines.get((graphs, "exact")) or engines.get((graphs, "pcg"))
        if spec is None:
            continue
        # the target-only engine's target has the captured 1-token graph (the speculative one: γ+1 only)
        single = engines.get((graphs, "target-only"), spec).target
        draft = (spec.draft, 1) if spec.draft is not None else head_step(spec)
        gamma = args.num_speculative_tokens
        ms = forward_costs({"target_1": (single, 1), "target_v": (spec.target, gamma + 1), "draft_1": draft},
                           args.context, consecutive=gamma)
        target_1, target_v, draft_1 = ms["target_1"], ms["target_v"], ms["draft_1"]
        costs[graphs] = {"target_1_ms": target_1, "target_verify_ms": target_v, "draft_1_ms": draft_1,
                         "c": draft_1 / target_1, "v": target_v / target_1}
        for row in rows:
            if row["graphs"] == graphs and row["acceptance_rate"] is not None:
                row["leviathan_bound"] = leviathan_bound(row["acceptance_rate"], gamma, costs[graphs]["c"],
                                                         costs[graphs]["v"])
                row["share_of_bound"] = row["speedup"] / row["leviathan_bound"] if row["speedup"] else None
    return {"command": "pcgtts bench step " + " ".join(sys.argv[sys.argv.index("step") + 1:])
            if "step" in sys.argv else " ".join(sys.argv),
            "machine": machine(), "draft": bundle.draft_dir.name if bundle.draft_dir else None,
            "num_speculative_tokens": args.num_speculative_tokens, "temperature": args.temperature,
            "max_tokens": args.max_tokens, "utterances": len(prompts), "repeats": args.repeats,
            "start_up": start_up, "forward_costs": costs, "rows": rows}


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"# Decode speed per acceptance rule (`{result['command']}`)", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} with {m['torch_threads']} "
             f"thread(s); native bf16: {m['native_bf16']}; CUDA: {m['cuda']}. "
             f"γ={result['num_speculative_tokens']}, "
             f"T={result['temperature']}, medians of {result['repeats']} round-robin repeats; every batch "
             f"size decodes the same {result['utterances']} utterances, in batches of its size.", "",
             "| graphs | batch | rule | tokens/s | speed-up | α | tokens/verify step | Leviathan bound "
             "| share |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    fmt = lambda x, f: "—" if x is None else format(x, f)  # noqa: E731
    for r in sorted(result["rows"], key=lambda r: (r["batch"], r["graphs"], RULES.index(r["rule"]))):
        lines.append(f"| {r['graphs']} | {r['batch']} | {r['rule']} | {r['tokens_per_s']:.0f} | "
                     f"{fmt(r['speedup'], '.2f')}x | {fmt(r['acceptance_rate'], '.2f')} | "
                     f"{r['tokens_per_verify_step']:.2f} | {fmt(r.get('leviathan_bound'), '.2f')} | "
                     f"{fmt(r.get('share_of_bound'), '.2f')} |")
    lines += ["", "Forward costs (batch 1, ms, medians of the mean of γ forwards in a row): "
              "c = draft/target, v = verify (γ+1 tokens)/single.",
              "", "| graphs | target 1 token | target γ+1 tokens | draft 1 token | c | v |",
              "| --- | --- | --- | --- | --- | --- |"]
    for g, c in result["forward_costs"].items():
        lines.append(f"| {g} | {c['target_1_ms']:.2f} | {c['target_verify_ms']:.2f} | {c['draft_1_ms']:.2f} "
                     f"| {c['c']:.2f} | {c['v']:.2f} |")
    lines += ["", "Start-up (engine construction incl. graph capture, seconds; a warm inductor cache makes "
              "later ones short):", ""]
    for k, s in result["start_up"].items():
        lines.append(f"- {k}: {s['seconds']:.1f} (capture {s['capture_seconds']:.1f})")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({r["batch"] for r in result["rows"]})
    fig, axes = plt.subplots(1, len(batches), figsize=(5 * len(batches), 4), squeeze=False)
    for ax, b in zip(axes[0], batches, strict=True):
        rows = [r for r in result["rows"] if r["batch"] == b]
        labels = [f"{r['graphs']}\n{r['rule']}" for r in rows]
        ax.bar(labels, [r["tokens_per_s"] for r in rows], color=[f"C{RULES.index(r['rule'])}" for r in rows])
        ax.set_title(f"batch {b}")
        ax.set_ylabel("tokens/s (median)")
        ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(args: argparse.Namespace) -> int:
    result = run(args)
    write_json(args.out / "step_speed.json", result)
    (args.out / "step_speed.md").write_text(markdown(result))
    plot(result, args.out / "step_speed.png")
    print(markdown(result))
    return 0
