"""c = draft cost / target cost per decoded token, for several drafts, measured side by side.

Each model decodes alone through the engine (batch 1, target-only, no speculation) the same prompt for the
same number of tokens; the models take turns, repeat after repeat, so machine load hits them alike; the
median per-token time of each gives c = draft / target. This is the engine's whole decode step (forward,
sampling), the cost a draft step adds to speculative decoding, with the engine's default (eager) forward.

    pcgtts bench draft-cost --drafts models/demo-en/draft OTHER_DRAFT [--reps 7] [--out bench/results]

Writes OUT/draft_cost.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from pcgtts.bench.common import machine, shown_path, write_json
from pcgtts.engine import Engine, EngineConfig, SamplingParams
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle


def per_token_ms(engine: Engine, prompt: list[int], tokens: int, seed: int) -> float:
    start = time.perf_counter()
    engine.generate([prompt], SamplingParams(temperature=0.8, max_tokens=tokens, seed=seed))
    return 1e3 * (time.perf_counter() - start) / tokens


def run(model_dir: Path, drafts: list[Path], reps: int, tokens: int, out_dir: Path) -> dict:
    torch.set_num_threads(1)
    bundle = ModelBundle.from_dir(model_dir)
    family = bundle.load_family()
    prompt = family.build_prompt("The little boat drifted slowly toward the northern shore.",
                                 family.voices[sorted(family.voices)[0]]).token_ids
    models = {"target": bundle.target_dir} | {shown_path(d): d for d in drafts}
    engines = {name: Engine(EngineConfig(target=path, num_speculative_tokens=0))
               for name, path in models.items()}
    times: dict[str, list[float]] = {name: [] for name in engines}
    for engine in engines.values():  # warm-up
        per_token_ms(engine, prompt, 20, 0)
    for rep in range(reps):
        for name, engine in engines.items():
            times[name].append(per_token_ms(engine, prompt, tokens, rep))
    med = {name: statistics.median(v) for name, v in times.items()}
    report = {"model": shown_path(model_dir), "tokens": tokens, "reps": reps, "machine": machine(),
              "ms_per_token": med,
              "c": {name: med[name] / med["target"] for name in med if name != "target"},
              "configs": {name: json.loads((Path(path) / "config.json").read_text()) for name, path in
                          models.items()}}
    write_json(out_dir / "draft_cost.json", report)
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR, help="bundle whose target is timed")
    parser.add_argument("--drafts", type=Path, nargs="+", required=True, help="draft directories to time")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=150)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))


def main(args: argparse.Namespace) -> int:
    report = run(args.model, args.drafts, args.reps, args.tokens, args.out)
    for name, ms in report["ms_per_token"].items():
        c = f"  c={report['c'][name]:.3f}" if name in report["c"] else ""
        print(f"{name:>40}: {ms:.3f} ms/token{c}")
    return 0
