"""Server load test: real-time capacity, time to first audio (TTFA), stalls and real-time factor (RTF).

Starts `pcgtts serve` as its own process (or targets a running server with --url) and sweeps concurrency
levels. At each level N clients stream PCM from POST /v1/audio/speech at once, each sending its requests
back to back (two sentences per client by default). Per request it records TTFA (request sent -> first
audio byte), RTF (wall time / audio seconds) and the stall a listener would hear: a player that starts at
the first byte, plays at 24 kHz and waits whenever it runs dry; its stall is the total time it waited.

**Real-time capacity** is the largest level at which p95 TTFA <= 1.0 s and p95 stall <= 0.2 s (the sweep
stops at the first level that misses, unless --full). Levels run in one session against one server, so
their ratios are comparable. Writes `load.json` (one row per level: TTFA p50/p95/p99, stall p50/p95/p99,
RTF p50/p95, aggregate audio-seconds per second, server CPU seconds per audio second and its inverse,
acceptance, prefix-cache hit rate), the machine's identity, and `at_capacity`: the row of the capacity
level, whose audio seconds per server CPU-second is the figure that travels between machines of different
speed better than the capacity itself (on a 2-core machine, capacity is bounded by twice it); and
`load.png`.

    pcgtts bench load --out bench/results/load
    pcgtts bench load --concurrency 1 4 8 12 16 --full --out bench/results/load
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import httpx
from pcgtts.bench.common import machine, ratio, write_json
from pcgtts.bench.served import OUTPUT_RATE, quantile, stall_events, stall_seconds, start_server

TTFA_SLO_S = 1.0  # p95 time to first audio at a level that counts as real time
STALL_SLO_S = 0.2  # p95 total stall per stream at such a level
DEFAULT_LEVELS = [1, 4, 8, 10, 12, 14, 16, 20, 24]
# Held-out sentences (not in the embedded model's training corpus), one per request.
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "She sells sea shells by the sea shore, and the shells she sells are surely sea shells.",
    "How much wood would a woodchuck chuck if a woodchuck could chuck wood?",
    "A journey of a thousand miles begins with a single step.",
    "Pack my box with five dozen liquor jugs, then send it to the harbour.",
    "Every morning the baker opens his shop before the sun comes up.",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=None, help="a running server (default: start `pcgtts serve` here)")
    parser.add_argument("--model", default=None, help="model dir for the started server (default: embedded)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=DEFAULT_LEVELS,
                        help="concurrency levels of the sweep, ascending")
    parser.add_argument("--per-client", type=int, default=2, help="requests each client sends back to back")
    parser.add_argument("--full", action="store_true", help="run every level (default: stop at the first "
                                                             "level that misses the real-time targets)")
    parser.add_argument("--format", default="pcm", choices=["pcm", "wav"])
    parser.add_argument("--voice", default=None, help="voice sent with every request (default: the server's)")
    parser.add_argument("--seed", action="store_true", help="send a seed with each request")
    parser.add_argument("--acceptance", default=None, help="acceptance rule sent with every request")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="extra flag for the started server, e.g. --server-arg=--acceptance=exact")
    parser.add_argument("--timelines", action="store_true",
                        help="keep every request's chunk arrivals and player waits in load.json")
    parser.add_argument("--out", type=Path, default=Path("bench/results/load"))


# ------------------------------------------------------------------------------------------ one request
async def one_request(client: httpx.AsyncClient, body: dict) -> dict:
    sent = time.perf_counter()
    arrivals: list[tuple[float, int]] = []  # (seconds since sent, bytes)
    async with client.stream("POST", "/v1/audio/speech", json=body) as response:
        if response.status_code != 200:
            return {"status": response.status_code, "error": (await response.aread()).decode()[:200]}
        async for chunk in response.aiter_bytes():
            if chunk:
                arrivals.append((time.perf_counter() - sent, len(chunk)))
    total = time.perf_counter() - sent
    audio_s = sum(n for _, n in arrivals) / 2 / OUTPUT_RATE
    return {"status": 200, "ttfa_s": arrivals[0][0] if arrivals else None, "e2e_s": total, "audio_s": audio_s,
            "rtf": total / audio_s if audio_s else None, "stall_s": stall_seconds(arrivals),
            "chunks": len(arrivals), "stalls": stall_events(arrivals),
            "arrivals": [(round(t, 4), n) for t, n in arrivals]}


# ------------------------------------------------------------------------------------------- one level
async def run_level(url: str, concurrency: int, args: argparse.Namespace) -> dict:
    results: list[dict] = []

    async def client_session(client: httpx.AsyncClient, c: int) -> None:
        for k in range(args.per_client):
            i = c * args.per_client + k
            body = {"model": "pcgtts", "input": TEXTS[i % len(TEXTS)], "response_format": args.format}
            if args.seed:  # seeded requests always speculate (reproducible), so they take no part in
                body["seed"] = i  # load-aware speculation; an operator's clients mostly send none
            if args.voice:
                body["voice"] = args.voice
            if args.acceptance:
                body["acceptance"] = args.acceptance
            sent = time.perf_counter() - started
            results.append(await one_request(client, body) | {"client": c, "k": k, "sent_s": round(sent, 4)})

    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        await one_request(client, {"model": "pcgtts", "input": "Warm up.", "response_format": "pcm"})
        before = await scrape(client)
        cpu_before = cpu_seconds(args.server_pid)
        started = time.perf_counter()
        await asyncio.gather(*(client_session(client, c) for c in range(concurrency)))
        wall = time.perf_counter() - started
        cpu_after = cpu_seconds(args.server_pid)
        after = await scrape(client)
    ok = [r for r in results if r["status"] == 200]
    row = summarize(concurrency, ok, len(results) - len(ok), wall)
    if args.timelines:  # every request's chunk arrivals and the player's waits (where stalls sit)
        row["requests_detail"] = results
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    row["acceptance_rate"] = _round(ratio(delta.get("accepted"), delta.get("drafted")))
    row["prefix_cache_hit_rate"] = _round(ratio(delta.get("prefix_hits"), delta.get("prefix_queries")))
    steps = delta.get("steps_speculative", 0) + delta.get("steps_target_only", 0)
    row["speculative_step_share"] = _round(ratio(delta.get("steps_speculative"), steps))
    row["codec_s_per_wall_s"] = _round(delta["codec_s"] / wall if "codec_s" in delta and wall else None)
    # CPU seconds the server spent per second of audio: unlike wall-clock rates this barely moves when
    # other jobs share the machine, so it compares builds measured on a busy machine (2 / it bounds the
    # real-time streams two idle cores could carry).
    cpu = cpu_after - cpu_before if cpu_before is not None else None
    row["server_cpu_s_per_audio_s"] = _round(ratio(cpu, row["audio_s"]))
    row["audio_s_per_server_cpu_s"] = _round(ratio(row["audio_s"], cpu))
    return row


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds so far of a process, its threads and its live child processes (the
    server's codec processes, tts/codec_process.py) (Linux /proc; None elsewhere)."""
    try:
        return sum(stat_cpu_seconds(Path(f"/proc/{p}/stat")) for p in process_tree(pid))
    except (OSError, ValueError, IndexError, TypeError):
        return None


def stat_cpu_seconds(stat: Path) -> float:
    """User + system CPU seconds from a /proc stat file (a process's, or one thread's under task/)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> list[int]:
    """pid and its descendants (from each thread's `children` list)."""
    tree, i = [int(pid)], 0
    while i < len(tree):
        for task in Path(f"/proc/{tree[i]}/task").iterdir():
            try:
                tree.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:  # the thread ended meanwhile
                pass
        i += 1
    return tree


METRICS = {"pcgtts:spec_decode_num_draft_tokens_total": "drafted",
           "pcgtts:spec_decode_num_accepted_tokens_total": "accepted",
           "pcgtts:prefix_cache_queries_total": "prefix_queries",
           "pcgtts:prefix_cache_hits_total": "prefix_hits",
           "pcgtts:codec_decode_seconds_total": "codec_s"}


async def scrape(client: httpx.AsyncClient) -> dict[str, float]:
    """The counters in METRICS from /metrics (differences around a level belong to that level)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families((await client.get("/metrics")).text):
        for sample in family.samples:
            key = METRICS.get(sample.name)
            if sample.name == "pcgtts:decode_steps_total":
                key = f"steps_{sample.labels.get('mode')}"
            if key is not None:
                out[key] = out.get(key, 0.0) + sample.value
    return out


def summarize(concurrency: int, ok: list[dict], failed: int, wall: float) -> dict:
    ttfa = [r["ttfa_s"] for r in ok if r["ttfa_s"] is not None]
    rtf = [r["rtf"] for r in ok if r["rtf"] is not None]
    stall = [r["stall_s"] for r in ok]
    audio = sum(r["audio_s"] for r in ok)
    row = {"concurrency": concurrency, "requests": len(ok), "failed": failed, "wall_s": round(wall, 3),
           "audio_s": round(audio, 3), "audio_s_per_wall_s": round(audio / wall, 3) if wall else None}
    for name, values in (("ttfa", ttfa), ("stall", stall)):
        row[f"{name}_p50_s"] = _round(statistics.median(values) if values else None)
        row[f"{name}_p95_s"] = _round(quantile(values, 0.95))
        row[f"{name}_p99_s"] = _round(quantile(values, 0.99))
    row["rtf_p50"] = _round(statistics.median(rtf) if rtf else None)
    row["rtf_p95"] = _round(quantile(rtf, 0.95))
    row["real_time"] = meets_targets(row)
    return row


def meets_targets(row: dict) -> bool:
    return (row["failed"] == 0 and row["requests"] > 0 and row["ttfa_p95_s"] is not None
            and row["ttfa_p95_s"] <= TTFA_SLO_S and row["stall_p95_s"] <= STALL_SLO_S)


def capacity(rows: list[dict]) -> int:
    """Largest level that meets the targets with every lower level of the sweep meeting them too."""
    best = 0
    for row in sorted(rows, key=lambda r: r["concurrency"]):
        if not row["real_time"]:
            break
        best = row["concurrency"]
    return best


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


# ------------------------------------------------------------------------------------------- the sweep
def print_table(rows: list[dict]) -> None:
    print(f"{'conc':>4} {'reqs':>4} {'TTFA p50':>8} {'p95':>6} {'p99':>6} {'stall p50':>9} {'p95':>6} "
          f"{'RTF p50':>7} {'audio s/s':>9} {'cpu/audio':>9} {'accept':>6} {'prefix':>6}  real time")
    for r in rows:
        print(f"{r['concurrency']:>4} {r['requests']:>4} {_f(r['ttfa_p50_s']):>8} {_f(r['ttfa_p95_s']):>6} "
              f"{_f(r['ttfa_p99_s']):>6} {_f(r['stall_p50_s']):>9} {_f(r['stall_p95_s']):>6} "
              f"{_f(r['rtf_p50']):>7} {_f(r['audio_s_per_wall_s']):>9} "
              f"{_f(r['server_cpu_s_per_audio_s']):>9} {_f(r['acceptance_rate']):>6} "
              f"{_f(r['prefix_cache_hit_rate']):>6}  {'yes' if r['real_time'] else 'NO'}")


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    levels = [r["concurrency"] for r in rows]
    fig, (left, mid, right) = plt.subplots(1, 3, figsize=(15, 4.2))
    for key, style in (("ttfa_p50_s", "o-"), ("ttfa_p95_s", "s-"), ("ttfa_p99_s", "^:")):
        left.plot(levels, [r[key] for r in rows], style, label=key.replace("_s", "").replace("_", " "))
    left.axhline(TTFA_SLO_S, color="grey", lw=1, ls="--", label="p95 target")
    left.set(xlabel="concurrent streams", ylabel="seconds", title="time to first audio")
    for key, style in (("stall_p50_s", "o-"), ("stall_p95_s", "s-"), ("stall_p99_s", "^:")):
        mid.plot(levels, [r[key] for r in rows], style, label=key.replace("_s", "").replace("_", " "))
    mid.axhline(STALL_SLO_S, color="grey", lw=1, ls="--", label="p95 target")
    mid.set(xlabel="concurrent streams", ylabel="seconds", title="player stall per stream")
    right.plot(levels, [r["audio_s_per_wall_s"] for r in rows], "o-", label="audio s per s")
    right.plot(levels, levels, color="grey", lw=1, ls="--", label="N x real time")
    right.set(xlabel="concurrent streams", title="aggregate audio seconds per second")
    for ax in (left, mid, right):
        ax.axvline(report["capacity"] or 0, color="tab:green", lw=1)
        ax.legend(fontsize=8)
    fig.suptitle(f"real-time capacity {report['capacity']} streams ({report['machine']['cpu']}, "
                 f"{report['machine']['cores']} cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(args: argparse.Namespace) -> int:
    import tempfile

    args.out.mkdir(parents=True, exist_ok=True)
    process = None
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as data_dir:
        url, args.server_pid = args.url, None
        if url is None:
            process, url = start_server(args, Path(data_dir))
            args.server_pid = process.pid
        try:
            model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]
            for concurrency in sorted(args.concurrency):
                print(f"[load] {concurrency} streams x {args.per_client} requests", flush=True)
                rows.append(asyncio.run(run_level(url, concurrency, args)))
                if not rows[-1]["real_time"] and not args.full:
                    break
        finally:
            if process is not None:
                process.terminate()
                process.wait(timeout=60)
    print_table(rows)
    cli = sys.argv[1:3] == ["bench", "load"]  # `pcgtts bench load` vs `python -m ...`
    command = "pcgtts bench load " + " ".join(sys.argv[3 if cli else 1:])
    best = capacity(rows)
    report = {"command": command, "capacity": best,
              "at_capacity": next((r for r in rows if r["concurrency"] == best), None),
              "targets": {"ttfa_p95_s": TTFA_SLO_S, "stall_p95_s": STALL_SLO_S},
              "machine": machine(), "model": model,
              "format": args.format, "acceptance": args.acceptance, "server_args": args.server_arg,
              "rows": rows}
    write_json(args.out / "load.json", report)
    plot(report, args.out / "load.png")
    at = report["at_capacity"]
    per_cpu = f", {_f(at['audio_s_per_server_cpu_s'])} s of audio per server CPU-second there" if at else ""
    print(f"real-time capacity: {best} streams{per_cpu} ({report['machine']['cpu']}, "
          f"{report['machine']['cores']} cores); wrote {args.out / 'load.json'}, load.png")
    return 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(_parser)
    raise SystemExit(main(_parser.parse_args()))
