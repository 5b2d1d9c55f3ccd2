"""`pcgtts` command line: each subcommand lives with the code it drives and registers itself here."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module exposing `register(subparsers)`, which adds a parser whose `func(args)` runs it.
SUBCOMMANDS = {
    "serve": "pcgtts.server.cli",
    "synth": "pcgtts.server.synth_cli",
    "asg": "pcgtts.asg_tables.cli",
    "bench": "pcgtts.bench.cli",
    "recipe": "pcgtts.recipes.cli",
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pcgtts", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    # Import only the module of the subcommand asked for, so `pcgtts asg` does not load the server.
    wanted = [a for a in argv if a in SUBCOMMANDS][:1] or list(SUBCOMMANDS)
    for name in wanted:
        importlib.import_module(SUBCOMMANDS[name]).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
