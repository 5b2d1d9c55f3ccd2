"""Tabulate the alternating `pcgtts bench load` sweeps kept beside this script, or in the directory given (one
directory per sweep, each with the load.json its `--out` wrote), for that directory's README.

    .venv/bin/python bench/results/capacity/rows-attention/summarize.py [bench/results/fp16-weights/capacity]
"""

import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).parent


def row_at(result: dict, streams: int) -> dict | None:
    return next((r for r in result["rows"] if r["concurrency"] == streams), None)


def stall_sites(row: dict) -> str:
    """Where a level's stalls sat, from `--timelines` sweeps: "k of n after the first chunk" ("-" without)."""
    if "requests_detail" not in row:
        return "-"
    waits = [chunk for r in row["requests_detail"] for chunk, _, _ in r["stalls"]]
    return f"{sum(chunk == 1 for chunk in waits)} of {len(waits)}"


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    sweeps = sorted(p for p in root.iterdir() if (p / "load.json").exists())
    print("| sweep | capacity | audio s per server CPU-s there | 1 stream: TTFA p50 | 16 streams: audio s "
          "per s, TTFA p95, stall p95 | 16 streams: stalls after the first chunk |")
    print("| --- | --- | --- | --- | --- | --- |")
    by_kind: dict[str, list[int]] = {}
    for sweep in sweeps:
        result = json.loads((sweep / "load.json").read_text())
        one, sixteen, there = row_at(result, 1), row_at(result, 16), result["at_capacity"]
        by_kind.setdefault(sweep.name.rsplit("-", 1)[0], []).append(result["capacity"])
        per_cpu = f"{there['audio_s_per_server_cpu_s']:.1f}" if there else "-"
        print(f"| {sweep.name} | {result['capacity']} | {per_cpu} | {one['ttfa_p50_s']:.3f} s | "
              f"{sixteen['audio_s_per_wall_s']:.1f}, {sixteen['ttfa_p95_s']:.2f} s, "
              f"{sixteen['stall_p95_s']:.2f} s | {stall_sites(sixteen)} |")
    print()
    for kind, capacities in by_kind.items():
        print(f"- {kind}: capacities {capacities}, median {statistics.median(capacities)}")


if __name__ == "__main__":
    main()
