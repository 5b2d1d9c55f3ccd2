"""Where a batched engine step's time goes: per phase, per batch size, target-only and PCG (issue 32 §1).

Decodes `--batch-sizes` speech requests together (the bundle's prompts, T=0.8, seeded) and times each phase
of the engine's step by wrapping the methods that carry it, on this engine instance only (the engine's code
is unchanged; a wrapper costs about a microsecond a call). Time is exclusive: a phase's time excludes the
phases called inside it (the LM head inside a head draft step counts as the LM head), so the phases add up
to the whole step. Phases:

    schedule          Scheduler.schedule: admission, KV block allocation, preemption
    prefill           prompt forwards (their own target / draft forwards included)
    draft forward     the feature head's (or the Llama draft's) forwards
    target forward    decode and verify forwards of the target, without its LM head or attention
    target attention  those forwards' attention calls (the backend's `attend`, every layer; where the backend
                      fuses RoPE and the K/V writes into it, `attend_unrotated`, which includes them)
    LM head           the target's vocabulary projection (draft proposals and verify alike)
    sampling          penalties, warping, softmax-and-draw of target and draft rows
    constraint        the family's decode constraint (the demo family's marker merge)
    verify            the acceptance rule
    decode glue       the speculative step around them: input tensors, roll-back, head states
    step glue         Engine.step around them: output handling, counters, stop checks

Per phase it reports ms per step at each batch size and the line through them (ms per step = fixed +
per-row x batch), which says what a step pays once and what it pays per row. One torch.profiler pass at the
middle batch size lists the aten ops by self CPU time (what the forward is made of).

    pcgtts bench profile --batch-sizes 8 16 32 --max-tokens 120 --out bench/results/capacity

Writes OUT/profile.json and OUT/profile.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch
from pcgtts.bench.common import bundle_engine, machine, speech_requests, write_json
from pcgtts.engine import Engine
from pcgtts.engine.config import CPU_ATTENTION, CPU_KV, CPU_WEIGHTS
from pcgtts.engine.sampling import BatchSampler
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle

# a backend's attention entry points: the plain one and the one that rotates q, k and writes K/V itself
ATTENTION_CALLS = ("attend", "attend_unrotated")
PHASES = ("schedule", "prefill", "draft forward", "target forward", "target attention", "LM head", "sampling",
          "constraint", "verify", "decode glue", "step glue")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR, help="model bundle directory")
    parser.add_argument("--rules", nargs="+", default=["target-only", "pcg"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--max-tokens", type=int, default=120)
    parser.add_argument("--repeats", type=int, default=3, help="decodes per (rule, batch); medians")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-ops", type=int, default=15, help="aten ops listed from the profiler pass")
    parser.add_argument("--seeded", action="store_true",
                        help="seed every request (its steps then take the batch-invariant forwards); "
                             "default: unseeded, as `bench load` sends them")
    parser.add_argument("--cpu-attention", default=None, choices=CPU_ATTENTION,
                        help="EngineConfig.cpu_attention (default: its default)")
    parser.add_argument("--cpu-weights", default=None, choices=CPU_WEIGHTS,
                        help="EngineConfig.cpu_weights (default: its default)")
    parser.add_argument("--cpu-kv", default=None, choices=CPU_KV,
                        help="EngineConfig.cpu_kv (default: its default)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("bench/results/capacity"))


class PhaseClock:
    """Exclusive time per phase: entering a phase pauses the one it was called from."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._stack: list[list] = []  # [phase, started, time spent in nested phases]

    @contextmanager
    def phase(self, name: str):
        if self._stack and self._stack[-1][0] == "prefill":
            name = "prefill"  # a prompt's forwards count as prefill
        frame = [name, time.perf_counter(), 0.0]
        self._stack.append(frame)
        try:
            yield
        finally:
            self._stack.pop()
            spent = time.perf_counter() - frame[1]
            self.seconds[name] += spent - frame[2]
            self.calls[name] += 1
            if self._stack:
                self._stack[-1][2] += spent

    def wrap(self, owner, attribute: str, name: str, inside: str | None = None) -> None:
        """Time owner.attribute (a bound method of an instance) as phase `name`; with `inside`, only when
        called from that phase (elsewhere it counts in its caller's)."""
        inner = getattr(owner, attribute)

        def timed(*args, **kwargs):
            if inside is not None and (not self._stack or self._stack[-1][0] != inside):
                return inner(*args, **kwargs)
            with self.phase(name):
                return inner(*args, **kwargs)

        setattr(owner, attribute, timed)


@contextmanager
def sampler_timed(clock: PhaseClock):
    """BatchSampler is made anew each step, so its methods are wrapped on the class, for this block only."""
    names = {"probs": "sampling", "probs_and_draw": "sampling", "_constrain": "constraint"}
    saved = {attribute: getattr(BatchSampler, attribute) for attribute in names}

    def timed(function, name):
        def method(self, *args, **kwargs):
            with clock.phase(name):
                return function(self, *args, **kwargs)
        return method

    for attribute, name in names.items():
        setattr(BatchSampler, attribute, timed(saved[attribute], name))
    try:
        yield
    finally:
        for attribute, function in saved.items():
            setattr(BatchSampler, attribute, function)


class TimedCall:
    """A callable object (the feature head) timed as a phase; other attributes pass through."""

    def __init__(self, inner, clock: PhaseClock, name: str):
        self.inner, self.clock, self.name = inner, clock, name

    def __call__(self, *args, **kwargs):
        with self.clock.phase(self.name):
            return self.inner(*args, **kwargs)

    def __getattr__(self, attribute):
        return getattr(self.inner, attribute)


def instrument(engine: Engine, clock: PhaseClock):
    """Wrap this engine's phase methods (instance attributes shadow the class's); returns the undo."""
    decoder = engine.decoder
    clock.wrap(engine, "step", "step glue")
    clock.wrap(engine.scheduler, "schedule", "schedule")
    clock.wrap(decoder, "prefill", "prefill")
    clock.wrap(decoder, "step", "decode glue")
    clock.wrap(decoder, "_verify", "verify")
    clock.wrap(engine.target, "forward", "target forward")
    clock.wrap(engine.target, "forward_chunks", "target forward")
    clock.wrap(engine.target, "logits", "LM head")
    # the target's attention backend (a draft sharing the object keeps its attention in "draft forward")
    for attribute in ATTENTION_CALLS:
        clock.wrap(engine.target.backend, attribute, "target attention", inside="target forward")
    head = decoder.head
    if head is not None:
        decoder.head = TimedCall(head, clock, "draft forward")
    if engine.draft is not None:
        for attribute in ("forward", "forward_chunks", "logits"):
            clock.wrap(engine.draft, attribute, "draft forward")

    def undo() -> None:
        decoder.head = head
        for attribute in ATTENTION_CALLS:
            vars(engine.target.backend).pop(attribute, None)
        for owner in (engine, engine.scheduler, decoder, engine.target, engine.draft):
            if owner is not None:
                for attribute in ("step", "schedule", "prefill", "_verify", "forward", "forward_chunks",
                                  "logits"):
                    vars(owner).pop(attribute, None)  # back to the class's methods
    return undo


def decode(engine: Engine, prompts: list, params: list) -> tuple[dict[str, float], int, int, float]:
    """One decode of every prompt together: (seconds per phase, engine steps, tokens, wall seconds)."""
    clock = PhaseClock()
    undo = instrument(engine, clock)
    steps_before = engine.metrics().steps
    try:
        with sampler_timed(clock):
            start = time.perf_counter()
            gens = engine.generate(prompts, params)
            wall = time.perf_counter() - start
    finally:
        undo()
    tokens = sum(len(g.token_ids) for g in gens)
    return dict(clock.seconds), engine.metrics().steps - steps_before, tokens, wall


def line_fit(xs: list[int], ys: list[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of ys over xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - slope * mx, slope


def op_table(engine: Engine, prompts: list, params: list, top: int) -> list[dict]:
    """aten ops by self CPU time over one decode (torch.profiler), the `top` largest."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine.generate(prompts, params)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1
    return [{"op": e.key, "calls": e.count, "self_ms": e.self_cpu_time_total / 1e3,
             "share": e.self_cpu_time_total / total} for e in events[:top]]


def requests(bundle: ModelBundle, n: int, args) -> tuple[list, list]:
    prompts, params = speech_requests(bundle, n, args.temperature, args.max_tokens)
    return prompts, params if args.seeded else [replace(p, seed=None) for p in params]


def run(args) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    bundle = ModelBundle.from_dir(args.model)
    most = max(args.batch_sizes)
    rows, ops = [], {}
    for rule in args.rules:
        engine = bundle_engine(bundle, rule, max_num_seqs=most, cpu_attention=args.cpu_attention,
                               cpu_weights=args.cpu_weights, cpu_kv=args.cpu_kv)
        engine.generate(*speech_requests(bundle, 2, args.temperature, 20))  # warm-up
        for b in args.batch_sizes:
            prompts, params = requests(bundle, b, args)
            runs = [decode(engine, prompts, params) for _ in range(args.repeats)]
            per_step = {phase: statistics.median(1e3 * r[0].get(phase, 0.0) / r[1] for r in runs)
                        for phase in PHASES}
            rows.append({"rule": rule, "batch": b, "steps": runs[0][1],
                         "tokens_per_s": statistics.median(r[2] / r[3] for r in runs),
                         "step_ms": statistics.median(1e3 * r[3] / r[1] for r in runs),
                         "phase_ms_per_step": per_step})
            print(f"{rule} batch {b}: {rows[-1]['step_ms']:.1f} ms a step, "
                  f"{rows[-1]['tokens_per_s']:.0f} tok/s", flush=True)
        middle = sorted(args.batch_sizes)[len(args.batch_sizes) // 2]
        ops[rule] = {"batch": middle, "ops": op_table(engine, *requests(bundle, middle, args), args.top_ops)}
    fits = {}
    for rule in args.rules:
        mine = [r for r in rows if r["rule"] == rule]
        xs = [r["batch"] for r in mine]
        series = {phase: [r["phase_ms_per_step"][phase] for r in mine] for phase in PHASES}
        series["step"] = [r["step_ms"] for r in mine]
        fits[rule] = {name: dict(zip(("fixed_ms", "per_row_ms"), line_fit(xs, ys), strict=True))
                      for name, ys in series.items()}
    command = ("pcgtts bench profile " + " ".join(sys.argv[sys.argv.index("profile") + 1:])
               if "profile" in sys.argv else " ".join(sys.argv))
    return {"command": command, "machine": machine(), "max_tokens": args.max_tokens, "seeded": args.seeded,
            "temperature": args.temperature, "repeats": args.repeats, "rows": rows, "fits": fits,
            "ops": ops}


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"# Where a batched step goes (`{result['command']}`)", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, {m['torch_threads']} thread(s). "
             f"ms per engine step (exclusive time per phase), medians of {result['repeats']} decodes.", ""]
    for rule, fit in result["fits"].items():
        mine = [r for r in result["rows"] if r["rule"] == rule]
        header = " | ".join(f"batch {r['batch']}" for r in mine)
        lines += [f"## {rule}", "", f"| phase | {header} | fixed ms | per row ms |",
                  "| --- |" + " --- |" * (len(mine) + 2)]
        for phase in PHASES:
            cells = " | ".join(f"{r['phase_ms_per_step'][phase]:.2f}" for r in mine)
            line = fit[phase]
            lines.append(f"| {phase} | {cells} | {line['fixed_ms']:.2f} | {line['per_row_ms']:.3f} |")
        cells = " | ".join(f"{r['step_ms']:.2f}" for r in mine)
        lines += [f"| **step** | {cells} | {fit['step']['fixed_ms']:.2f} | {fit['step']['per_row_ms']:.3f} |",
                  "| tokens/s | " + " | ".join(f"{r['tokens_per_s']:.0f}" for r in mine) + " | | |", ""]
        table = result["ops"][rule]
        lines += [f"aten ops by self CPU time, batch {table['batch']}:", "",
                  "| op | calls | self ms | share |", "| --- | --- | --- | --- |"]
        lines += [f"| `{o['op']}` | {o['calls']} | {o['self_ms']:.1f} | {o['share']:.1%} |"
                  for o in table["ops"]]
        lines.append("")
    return "\n".join(lines)


def main(args) -> None:
    result = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "profile.json", result)
    (args.out / "profile.md").write_text(markdown(result))
    print(markdown(result))
