"""Acceptance-rule sweep: target-only, exact SD, block verification, SSD, top-k tolerance, LANTERN, PCG and
PCG-block side by side.

Every configuration decodes the same prompts (same texts, voices and seeds) through the same engine, one
after another in one process, so the speed ratios are taken side by side. Quality is measured on the
decoded audio: WER of an offline ASR (Whisper tiny.en, the `eval` extra) against the input text, the share
of utterances that ended by themselves, and the duration. Rows go to `DIR/acceptance.json` (a list of
dicts with at least rule, params, acceptance_rate, mean_accepted_len, tokens_per_s, speedup, wer) and a
speed-vs-WER plot to `DIR/acceptance.png`.

    pcgtts bench acceptance --quick --out bench/results
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from pcgtts.bench.common import SENTENCES, DecodeTally, machine, speech_requests, write_json
from pcgtts.engine import Engine, EngineConfig
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle


@dataclass
class RuleSpec:
    """One configuration of the sweep; `theta` builds an ASG table from the target for the group rules."""

    label: str
    rule: str  # "target-only" or an engine.acceptance rule name
    params: dict = field(default_factory=dict)
    theta: float | str | None = None  # BUNDLE_TABLE: the bundle's own table, whatever built it


BUNDLE_TABLE = "bundle"


def default_specs(quick: bool, bundle_theta: float | None, bundle_table: str | None = None) -> list[RuleSpec]:
    """bundle_table: the name of a bundle table not built from embeddings by cosine θ (e.g. acoustic
    groups); it runs first among the PCG rows, and the cosine rows use the paper's construction at 0.55."""
    theta = bundle_theta if bundle_theta is not None else (0.55 if bundle_table else 0.40)
    bundle_rows = [RuleSpec(f"pcg {bundle_table}", "pcg", {}, theta=BUNDLE_TABLE)] if bundle_table else []
    specs = [
        RuleSpec("target-only", "target-only"),
        RuleSpec("exact", "exact"),
        RuleSpec("block", "block"),
        RuleSpec("ssd β=0.2", "ssd", {"bias": 0.2}),
        RuleSpec("top-k k=3", "topk", {"k": 3}),
        RuleSpec("lantern k=5 δ=0.2", "lantern", {"k": 5, "delta": 0.2}, theta=theta),
        *bundle_rows,
        RuleSpec(f"pcg θ={theta:.2f}", "pcg", {}, theta=theta),
        RuleSpec(f"pcg-block θ={theta:.2f}", "pcg-block", {}, theta=theta),
        # a looser table: larger groups, more acceptance, the quality price to measure
        RuleSpec(f"pcg θ={theta - 0.1:.2f}", "pcg", {}, theta=round(theta - 0.1, 4)),
    ]
    if not quick:
        specs += [
            RuleSpec("ssd β=0.1", "ssd", {"bias": 0.1}),
            RuleSpec("top-k k=10", "topk", {"k": 10}),
            RuleSpec("lantern k=10 δ=0.4", "lantern", {"k": 10, "delta": 0.4}, theta=theta),
        ]
        specs += [RuleSpec(f"pcg θ={t:.2f}", "pcg", {}, theta=t) for t in (0.30, 0.35, 0.45, 0.55)
                  if min(abs(t - theta), abs(t - theta + 0.1)) > 1e-6]
    return specs


class TableCache:
    """ASG tables for the target at each θ: the bundle's own when θ matches, else built once and cached.

    New tables cover the same token range as the bundle's table (its speech tokens), or the whole
    vocabulary when the bundle has none."""

    def __init__(self, bundle: ModelBundle, workdir: Path):
        from pcgtts.asg_tables.report import speech_range
        from pcgtts.asg_tables.table import ASGTable

        self.bundle, self.workdir, self.paths = bundle, workdir, {}
        self.token_range: tuple[int, int] | None = None
        self.bundle_theta: float | None = None
        self.bundle_table: str | None = None  # set when the bundle's table is not cosine-θ groups
        if bundle.asg_table is not None:
            table = ASGTable.load(bundle.asg_table)
            self.token_range = speech_range(table)
            if table.meta.get("metric", "cosine") == "cosine":
                self.bundle_theta = float(table.meta["theta"])
                self.paths[self.bundle_theta] = bundle.asg_table
            else:
                self.bundle_table = table.meta.get("name") or f"{table.meta.get('grouping', 'table')} " \
                    f"({table.meta['metric']} ≤ {float(table.meta['theta']):.3g})"
                self.paths[BUNDLE_TABLE] = bundle.asg_table

    def path(self, theta: float | str) -> Path:
        if theta not in self.paths:
            self.paths[theta] = self._build(theta)
        return self.paths[theta]

    def _build(self, theta: float) -> Path:
        from pcgtts.asg_tables.build import build_asg
        from pcgtts.asg_tables.embeddings import read_embedding_rows, vocab_size_of

        start, end = self.token_range or (0, vocab_size_of(self.bundle.target_dir))
        rows, source = read_embedding_rows(self.bundle.target_dir, start, end - start)
        out = self.workdir / f"asg-theta{theta:.2f}.safetensors"
        table = build_asg(rows, theta, offset=start, vocab_size=vocab_size_of(self.bundle.target_dir),
                          progress=False, meta=source)
        table.save(out)
        return out


def engine_config(bundle: ModelBundle, spec: RuleSpec, tables: TableCache, num_speculative_tokens: int,
                  device: str) -> EngineConfig:
    spec_decoding = spec.rule != "target-only"
    return EngineConfig(
        target=bundle.target_dir,
        draft=bundle.draft_dir if spec_decoding else None,
        acceptance=spec.rule if spec_decoding else "exact",
        acceptance_params=dict(spec.params),
        asg_table=tables.path(spec.theta) if spec.theta is not None else None,
        num_speculative_tokens=num_speculative_tokens if spec_decoding else 0,
        device=device,
    )


def run_spec(bundle: ModelBundle, spec: RuleSpec, tables: TableCache, prompts, params,
             num_speculative_tokens: int, device: str) -> tuple[dict, list[list[int]]]:
    engine = Engine(engine_config(bundle, spec, tables, num_speculative_tokens, device))
    engine.generate(prompts[:1], [params[0]])  # warm-up: first-call allocations stay out of the timing
    start = time.perf_counter()
    gens = engine.generate(prompts, params)
    wall = time.perf_counter() - start
    tally = DecodeTally.of(gens)
    row = {
        "label": spec.label,
        "rule": spec.rule,
        "params": {**spec.params, **({"theta": spec.theta} if spec.theta is not None else {})},
        "num_speculative_tokens": num_speculative_tokens if spec.rule != "target-only" else 0,
        "wall_s": wall,
        "tokens": tally.tokens,
        "tokens_per_s": tally.tokens / wall,
        "acceptance_rate": tally.acceptance_rate,
        "mean_accepted_len": tally.mean_accepted_len,
        "ended_by_itself": sum(g.finish_reason == "stop" for g in gens) / len(gens),
    }
    return row, [g.token_ids for g in gens]


def measure_quality(bundle: ModelBundle, texts: list[str], outputs: list[list[int]],
                    transcribe: Callable[[list[np.ndarray], int], list[str]] | None) -> dict:
    family, codec = bundle.load_family(), bundle.load_codec()
    audio = [codec.decode(family.tokens_to_codes(tokens)) for tokens in outputs]
    durations = [len(a) / codec.sample_rate for a in audio]
    quality = {"median_duration_s": statistics.median(durations)}
    if transcribe is None:
        quality["wer"] = None
        return quality
    from pcgtts.bench.quality import word_error_rate

    hyps = transcribe(audio, codec.sample_rate)
    quality["wer"] = word_error_rate(texts, hyps)
    return quality


def run_sweep(model_dir: Path, out_dir: Path, *, quick: bool, num_speculative_tokens: int = 3,
              temperature: float = 0.8,
              seed: int = 0, device: str = "cpu", with_asr: bool = True, max_tokens: int = 800,
              rules: set[str] | None = None) -> list[dict]:
    bundle = ModelBundle.from_dir(model_dir)
    texts = SENTENCES[:6] if quick else SENTENCES
    prompts, params = speech_requests(bundle, len(texts), temperature, max_tokens, seed)
    transcribe = None
    if with_asr:
        from pcgtts.bench.quality import load_transcriber

        transcribe = load_transcriber()
        if transcribe is None:
            print("no ASR installed (pip install -e '.[eval]'): WER is not measured", flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        tables = TableCache(bundle, Path(tmp))
        specs = [s for s in default_specs(quick, tables.bundle_theta, tables.bundle_table)
                 if rules is None or s.rule in rules or s.rule == "target-only"]
        for spec in specs:
            torch.manual_seed(seed)
            row, outputs = run_spec(bundle, spec, tables, prompts, params, num_speculative_tokens, device)
            row.update(measure_quality(bundle, texts, outputs, transcribe))
            rows.append(row)
            print(f"{spec.label:>22}: {row['tokens_per_s']:7.1f} tok/s  α={row['acceptance_rate']}  "
                  f"WER={row['wer']}", flush=True)
    base = next((r["tokens_per_s"] for r in rows if r["rule"] == "target-only"), None)
    for row in rows:
        row["speedup"] = row["tokens_per_s"] / base if base else None
    meta = {"model": str(model_dir), "device": device, "num_speculative_tokens": num_speculative_tokens,
            "temperature": temperature,
            "num_utterances": len(texts), "machine": machine()}
    write_json(out_dir / "acceptance.json", rows)
    write_json(out_dir / "acceptance_meta.json", meta)
    plot(rows, out_dir / "acceptance.png")
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = [r["label"] for r in rows]
    left.barh(labels, [r["speedup"] or 0 for r in rows], color="tab:blue")
    left.axvline(1.0, color="grey", lw=1)
    left.set_xlabel("speed-up over target-only (tokens/s ratio, same run)")
    for r in rows:
        if r["wer"] is not None:
            right.scatter(r["speedup"], r["wer"])
            right.annotate(r["label"], (r["speedup"], r["wer"]), fontsize=8)
    right.set_xlabel("speed-up")
    right.set_ylabel("WER (Whisper tiny.en)")
    right.set_title("speed vs intelligibility")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR, help="model bundle directory")
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="output directory")
    parser.add_argument("--quick", action="store_true", help="6 utterances, the main rules")
    parser.add_argument("--num-speculative-tokens", type=int, default=3, help="draft tokens per step (γ)")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-asr", action="store_true", help="skip the WER measurement")
    parser.add_argument("--rules", default=None,
                        help="comma-separated rule names to run (target-only always runs), e.g. exact,pcg")
    parser.add_argument("--max-tokens", type=int, default=800, help="cap on generated tokens per utterance")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (the server's CPU default is 1; 0 = torch's default)")


def main(args: argparse.Namespace) -> int:
    if getattr(args, "threads", 0):
        torch.set_num_threads(args.threads)
    rows = run_sweep(args.model, args.out, quick=args.quick,
                     num_speculative_tokens=args.num_speculative_tokens, temperature=args.temperature,
                     seed=args.seed, device=args.device, with_asr=not args.no_asr, max_tokens=args.max_tokens,
                     rules=set(args.rules.split(",")) if args.rules else None)
    print(json.dumps([{k: r[k] for k in ("label", "speedup", "acceptance_rate", "wer")} for r in rows],
                     indent=1))
    return 0


