"""`pcgtts bench acceptance|codec|engine|load|verify`: each benchmark module provides `add_arguments(parser)`
and `main(args)`, or a `main(argv)` with a parser of its own."""

from __future__ import annotations

import argparse
import importlib

# name -> (module under pcgtts.bench, what it measures)
BENCHMARKS = {
    "acceptance": ("acceptance_sweep", "acceptance rules side by side: speed and quality"),
    "codec": ("codec_bench", "streaming codec: batched vs one-by-one decode, first audio block"),
    "engine": ("engine_bench", "engine tokens/s: target-only, exact, pcg; transformers reference"),
    "load": ("load_test", "server load test: time to first audio, real-time factor"),
    "step": ("step_speed", "decode speed per acceptance rule, eager vs captured graphs; c and v"),
    "verify": ("verify_speed", "verify() cost vs a target forward; ASG build time and memory"),
    "rejections": ("rejections", "why drafts are rejected; embedding vs acoustic ASGs"),
    "draft-cost": ("draft_cost", "c = draft / target per-token cost, drafts side by side"),
    "groups": ("groups", "ASGs: swap test and PCG decoding, WER and similarity"),
    "voice-agent": ("voice_agent", "WebSocket sentence mode: first audio while an LLM still writes"),
    "invariance": ("batch_invariance", "where a row's numbers depend on its batch mates, op by op"),
    "profile": ("profile", "where a batched engine step's time goes, per phase and batch size"),
    "draft-length": ("draft_length", "draft length that follows confidence vs fixed γ: tokens per step"),
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="benchmarks (results and plots under --out)")
    inner = parser.add_subparsers(dest="benchmark", required=True)
    for name, (module_name, help_text) in BENCHMARKS.items():
        module = importlib.import_module(f"{__package__}.{module_name}")
        sub = inner.add_parser(name, help=help_text, description=module.__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
        if hasattr(module, "add_arguments"):
            module.add_arguments(sub)
            sub.set_defaults(func=module.main)
        else:  # a module with its own parser: main(argv)
            sub.add_argument("argv", nargs=argparse.REMAINDER, help="arguments of the benchmark")
            sub.set_defaults(func=lambda args, main=module.main: main(args.argv))
