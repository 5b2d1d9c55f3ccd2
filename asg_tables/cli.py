"""`pcgtts asg build|stats`: build an ASG table from a checkpoint's embeddings, or report on one."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pcgtts.asg_tables.embeddings import (
    LLASA_NUM_SPEECH_TOKENS,
    LLASA_SPEECH_OFFSET,
    read_embedding_rows,
    vocab_size_of,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    asg = subparsers.add_parser("asg", help="build and inspect Acoustic Similarity Group tables")
    sub = asg.add_subparsers(dest="asg_command", required=True)

    build = sub.add_parser(
        "build",
        help="build a table from a Hugging Face checkpoint's embeddings",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    build.add_argument("--model", required=True, type=Path, help="checkpoint directory (safetensors)")
    build.add_argument(
        "--theta",
        required=True,
        type=float,
        nargs="+",
        help="cosine threshold θ (paper: 0.38-0.45); several values (or --sweep) print group sizes per θ",
    )
    build.add_argument("--sweep", action="store_true", help="only print group sizes per θ, build nothing")
    build.add_argument("--out", type=Path, help="output .safetensors table")
    build.add_argument(
        "--offset", type=int, default=LLASA_SPEECH_OFFSET, help="first speech token id (Llasa)"
    )
    build.add_argument(
        "--num-tokens", type=int, default=LLASA_NUM_SPEECH_TOKENS, help="speech tokens (X-codec2)"
    )
    build.add_argument("--vocab-size", type=int, help="full vocabulary (default: config.json vocab_size)")
    build.add_argument(
        "--which",
        choices=("input", "output"),
        default="input",
        help="input embeddings (paper's reading) or LM-head rows",
    )
    build.add_argument(
        "--block-rows", type=int, default=1024, help="rows per similarity block (memory bound)"
    )
    build.add_argument("--device", default="cpu")
    build.add_argument("--plot", type=Path, help="also write the stats plot (PNG) here")
    build.set_defaults(func=run_build)

    stats = sub.add_parser("stats", help="group-size and N(t) histograms, coverage, memory; PNG plot")
    stats.add_argument("table", type=Path)
    stats.add_argument("--plot", type=Path, help="PNG path (default: next to the table)")
    stats.add_argument("--json", action="store_true", help="print the stats as JSON")
    stats.set_defaults(func=run_stats)


def run_build(args: argparse.Namespace) -> int:
    from pcgtts.asg_tables.build import build_asg, seed_group_sizes
    from pcgtts.asg_tables.report import format_stats, plot_stats, table_stats

    rows, source = read_embedding_rows(args.model, args.offset, args.num_tokens, args.which)
    if args.sweep or len(args.theta) > 1:
        sizes = seed_group_sizes(rows, args.theta, block_rows=args.block_rows, device=args.device).double()
        print(f"{'theta':>7} {'mean |G(t)|':>12} {'median':>7} {'max':>7} {'singleton %':>12}")
        for theta, s in zip(args.theta, sizes, strict=True):
            singleton = 100 * (s == 1).double().mean()
            print(f"{theta:7.3f} {s.mean():12.2f} {s.median():7.0f} {s.max():7.0f} {singleton:12.1f}")
        if args.out is None:
            return 0
        if len(args.theta) > 1:
            print("--out needs a single --theta", file=sys.stderr)
            return 2
    if args.out is None:
        print("--out is required to build a table", file=sys.stderr)
        return 2
    vocab_size = args.vocab_size or vocab_size_of(args.model) or args.offset + rows.shape[0]
    table = build_asg(
        rows,
        args.theta[0],
        offset=args.offset,
        vocab_size=vocab_size,
        block_rows=args.block_rows,
        device=args.device,
        meta=source,
    ).to("cpu")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.save(args.out)
    print(format_stats(table_stats(table)))
    print(f"wrote {args.out}")
    if args.plot:
        plot_stats(table, args.plot)
        print(f"wrote {args.plot}")
    return 0


def run_stats(args: argparse.Namespace) -> int:
    from pcgtts.asg_tables.report import format_stats, plot_stats, table_stats
    from pcgtts.asg_tables.table import ASGTable

    table = ASGTable.load(args.table)
    stats = table_stats(table)
    print(json.dumps(stats, indent=2) if args.json else format_stats(stats))
    plot = args.plot or args.table.with_suffix(".png")
    plot_stats(table, plot)
    print(f"wrote {plot}", file=sys.stderr if args.json else sys.stdout)
    return 0
