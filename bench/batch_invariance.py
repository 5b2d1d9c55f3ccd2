"""Where a row's numbers depend on what shares its forward: one sequence's forward alone and inside batches
of other sequences (several sizes, places and contexts), compared bit for bit op by op.

Every projection, norm, rotation and attention call of the target (and the feature head's steps) records
the probe row's output; the report names, for each batch, the first op whose output differs from the
probe's forward alone, or "identical". With `--deterministic off` it shows what the engine's
batch-invariant plan (engine/batch_invariance.py) removes; with the default, a speed change that breaks the
plan shows up here op by op (the tests in tests/engine/test_batch_invariance.py only say that it broke).

    pcgtts bench invariance --deterministic off always --out bench/results/determinism

Writes OUT/invariance.json and OUT/invariance.md.
"""

from __future__ import annotations

import argparse
import random
import sys
from contextlib import contextmanager
from pathlib import Path

import torch
from pcgtts.bench.common import machine, write_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=None, help="bundle dir (default: the embedded model)")
    parser.add_argument("--deterministic", nargs="+", default=["off", "always"],
                        help="EngineConfig.deterministic modes to probe (off: no plan; always: the plan)")
    parser.add_argument("--probe-length", type=int, nargs="+", default=[100, 300, 800],
                        help="cached tokens of the probe row")
    parser.add_argument("--mates", type=int, nargs="+", default=[40, 700, 250, 17, 300, 64, 530],
                        help="cached tokens of its batch mates")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("bench/results/determinism"))


@contextmanager
def recording(row: list[int], log: list):
    """While active, the outputs of the forward's ops for batch row row[0] are appended to `log`."""
    from pcgtts.engine import attention
    from pcgtts.engine.model import feature_head, llama, rope

    targets = [(llama.Projection, "__call__", "projection"), (llama.RMSNorm, "__call__", "norm"),
               (rope.RotaryEmbedding, "rotate", "rope"), (attention.GatherSDPABackend, "attend", "attention"),
               (attention.GatherSDPABackend, "attend_unrotated", "attention"),
               (feature_head.FeatureHead, "__call__", "head")]
    saved = [(cls, name, getattr(cls, name)) for cls, name, _ in targets]

    def wrap(fn, label):
        def recorded(self, *args, **kwargs):
            out = fn(self, *args, **kwargs)
            log.append((label, out[row[0]].detach().clone()))
            return out
        return recorded

    for (cls, name, label), (_, _, fn) in zip(targets, saved, strict=True):
        setattr(cls, name, wrap(fn, label))
    try:
        yield
    finally:
        for cls, name, fn in saved:
            setattr(cls, name, fn)


def first_difference(a: list, b: list) -> str:
    for i, ((label, x), (_, y)) in enumerate(zip(a, b, strict=True)):
        if not torch.equal(x, y):
            return f"op {i} of {len(a)} ({label}), max |diff| {float((x - y).abs().max()):.1e}"
    return "identical"


def probe(engine, probe_length: int, mates: list[int], seed: int = 0) -> list[dict]:
    """One probe row's ops alone vs in batches, for one-token and verify-sized forwards and head steps."""
    from pcgtts.engine.block_manager import SeqBlocks

    runner, rng = engine.target, random.Random(seed)
    gamma = max(engine.num_speculative_tokens, 1)
    rows = []
    for n in [probe_length, *mates]:
        st = SeqBlocks()
        st.ensure(runner.blocks, n + gamma + 1)
        tokens = [rng.randrange(engine.vocab_size) for _ in range(n)]
        runner.forward_chunks([st], [tokens[:-1]])
        rows.append((st, tokens))
    place = [0]

    def forward(order: list[int], t: int) -> list:
        log: list = []
        chosen = [rows[i] for i in order]
        ids = torch.tensor([[toks[-1]] + [7] * (t - 1) for _, toks in chosen])
        pos = torch.tensor([list(range(len(toks) - 1, len(toks) - 1 + t)) for _, toks in chosen])
        states = [st for st, _ in chosen]
        tables = runner.block_tables(states, max(len(toks) for _, toks in chosen) + t)
        with recording(place, log), torch.inference_mode():
            hidden = runner.forward(ids, pos, torch.ones_like(ids, dtype=torch.bool), tables, states=states)
            log.append(("logits", runner.logits(hidden)[place[0]].clone()))
            if engine.head is not None and t == 1:
                state = engine.head(hidden[:, -1], ids[:, 0])
                log.append(("head logits", runner.logits(state[:, None])[place[0]].clone()))
        for st, toks in chosen:
            st.num_computed = len(toks) - 1
        return log

    results = []
    try:
        for t in sorted({1, gamma + 1}):
            place[0] = 0
            alone = forward([0], t)
            for k in range(1, len(mates) + 1):
                for where in sorted({0, k // 2, k}):
                    others = list(range(1, k + 1))
                    place[0] = where
                    got = forward(others[:where] + [0] + others[where:], t)
                    results.append({"probe_length": probe_length, "tokens": t, "batch": k + 1, "place": where,
                                    "first_difference": first_difference(alone, got)})
    finally:
        for st, _ in rows:
            st.release(runner.blocks)
    return results


def run(args) -> dict:
    from pcgtts.engine import Engine, EngineConfig
    from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle

    torch.set_num_threads(args.threads)
    bundle = ModelBundle.from_dir(args.model or DEFAULT_MODEL_DIR)
    out = {"command": "pcgtts bench invariance " + " ".join(sys.argv[sys.argv.index("invariance") + 1:])
           if "invariance" in sys.argv else " ".join(sys.argv), "modes": {}}
    for mode in args.deterministic:
        engine = Engine(EngineConfig(target=bundle.target_dir, draft=bundle.draft_dir, deterministic=mode,
                                     max_num_seqs=16))
        for part in (engine.target, engine.draft, engine.head):  # every forward of this mode takes the plan
            if part is not None:
                part.apply_plan(engine.invariance)
        rows = [r for n in args.probe_length for r in probe(engine, n, args.mates)]
        out["modes"][mode] = {"plan": vars(engine.invariance) if engine.invariance.active else None,
                              "rows": rows}
        same = sum(r["first_difference"] == "identical" for r in rows)
        print(f"{mode}: {same} of {len(rows)} batches identical to the probe alone", flush=True)
    return out


def markdown(result: dict) -> str:
    lines = [f"# Batch invariance, op by op (`{result['command']}`)", ""]
    for mode, res in result["modes"].items():
        lines += [f"## deterministic={mode}, plan {res['plan']}", "",
                  "| probe tokens cached | tokens per row | batch | probe at | first differing op |",
                  "| --- | --- | --- | --- | --- |"]
        lines += ["| " + " | ".join(str(r[k]) for k in ("probe_length", "tokens", "batch", "place",
                                                         "first_difference")) + " |" for r in res["rows"]]
        lines.append("")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    result = {**run(args), "machine": machine()}
    write_json(args.out / "invariance.json", result)
    (args.out / "invariance.md").write_text(markdown(result))
    return 0
