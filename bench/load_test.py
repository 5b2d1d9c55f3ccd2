"""Server load test: time to first audio (TTFA) and real-time factor (RTF) at several concurrency levels.

Starts `pcgtts serve` as its own process (or targets a running server with --url), then for each
concurrency level runs that many client streams against POST /v1/audio/speech (streamed PCM), each
sending requests back to back. Per request: TTFA (request sent -> first audio bytes), RTF (wall time /
audio seconds), and underrun (the worst stall a player starting at the first chunk would hear). Levels run
in one session, so their ratios are comparable; medians and p90s are reported.

    pcgtts bench load --concurrency 1 8 --requests 16 --out bench/results/load
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

OUTPUT_RATE = 24000
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
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8], help="concurrent streams")
    parser.add_argument("--requests", type=int, default=None,
                        help="requests per level (default: 2 x concurrency, at least 4)")
    parser.add_argument("--format", default="pcm", choices=["pcm", "wav", "mp3", "opus", "aac", "flac"])
    parser.add_argument("--acceptance", default=None, help="acceptance rule sent with every request")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="extra flag for the started server, e.g. --server-arg=--acceptance=exact")
    parser.add_argument("--out", type=Path, default=Path("bench/results/load"))


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
    audio_bytes = sum(n for _, n in arrivals)
    audio_s = audio_bytes / 2 / OUTPUT_RATE if body["response_format"] in ("pcm", "wav") else None
    underrun, played = 0.0, 0.0
    if audio_s is not None and arrivals:
        t0 = arrivals[0][0]
        for t, n in arrivals:  # buffered audio (played so far) vs wall time since the first chunk
            underrun = max(underrun, (t - t0) - played)
            played += n / 2 / OUTPUT_RATE
    return {"status": 200, "ttfa_s": arrivals[0][0] if arrivals else None, "e2e_s": total, "audio_s": audio_s,
            "rtf": total / audio_s if audio_s else None, "underrun_s": underrun, "chunks": len(arrivals)}


async def run_level(url: str, concurrency: int, requests: int, args: argparse.Namespace) -> dict:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    results: list[dict] = []

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            body = {"model": "pcgtts", "input": TEXTS[i % len(TEXTS)], "response_format": args.format,
                    "seed": i}
            if args.acceptance:
                body["acceptance"] = args.acceptance
            results.append(await one_request(client, body))

    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        await one_request(client, {"model": "pcgtts", "input": "Warm up.", "response_format": "pcm"})
        before = await spec_counters(client)
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        wall = time.perf_counter() - started
        after = await spec_counters(client)
    ok = [r for r in results if r["status"] == 200]
    row = summarize(concurrency, ok, len(results) - len(ok), wall)
    drafted, accepted = (after[k] - before[k] for k in ("drafted", "accepted"))
    row["acceptance_rate"] = round(accepted / drafted, 4) if drafted else None
    return row


async def spec_counters(client: httpx.AsyncClient) -> dict[str, float]:
    """Drafted/accepted token counters from /metrics (differences around a level give its acceptance)."""
    from prometheus_client.parser import text_string_to_metric_families

    names = {"pcgtts:spec_decode_num_draft_tokens_total": "drafted",
             "pcgtts:spec_decode_num_accepted_tokens_total": "accepted"}
    out = {"drafted": 0.0, "accepted": 0.0}
    for family in text_string_to_metric_families((await client.get("/metrics")).text):
        for sample in family.samples:
            if sample.name in names:
                out[names[sample.name]] += sample.value
    return out


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def summarize(concurrency: int, ok: list[dict], failed: int, wall: float) -> dict:
    ttfa = [r["ttfa_s"] for r in ok if r["ttfa_s"] is not None]
    rtf = [r["rtf"] for r in ok if r["rtf"] is not None]
    audio = sum(r["audio_s"] or 0 for r in ok)
    underrun = [r["underrun_s"] for r in ok]
    return {
        "concurrency": concurrency, "requests": len(ok), "failed": failed, "wall_s": round(wall, 3),
        "ttfa_p50_s": _round(statistics.median(ttfa) if ttfa else None),
        "ttfa_p90_s": _round(_quantile(ttfa, 0.9)),
        "rtf_p50": _round(statistics.median(rtf) if rtf else None), "rtf_p90": _round(_quantile(rtf, 0.9)),
        "audio_s": round(audio, 3), "audio_s_per_wall_s": round(audio / wall, 3) if wall else None,
        "continuity_ok": sum(u < 0.1 for u in underrun) / len(underrun) if underrun else None,
        "underrun_p90_s": _round(_quantile(underrun, 0.9)),
    }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def start_server(args: argparse.Namespace, data_dir: Path) -> tuple[subprocess.Popen, str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "pcgtts.cli", "serve", "--port", str(port), "--data-dir", str(data_dir),
           "--log-level", "warning", *args.server_arg]
    if args.model:
        cmd += ["--model", args.model]
    process = subprocess.Popen(cmd, env=os.environ.copy())
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server exited with {process.returncode}")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    process.terminate()
    raise SystemExit("server did not become ready")


def print_table(rows: list[dict]) -> None:
    base = rows[0]
    print(f"{'conc':>4} {'reqs':>4} {'TTFA p50':>9} {'TTFA p90':>9} {'RTF p50':>8} {'RTF p90':>8} "
          f"{'audio s/s':>9} {'cont. ok':>8} {'accept':>6}  TTFA x / RTF x vs c={base['concurrency']}")
    for r in rows:
        ratio_ttfa = r["ttfa_p50_s"] / base["ttfa_p50_s"] if base["ttfa_p50_s"] else float("nan")
        ratio_rtf = r["rtf_p50"] / base["rtf_p50"] if base["rtf_p50"] else float("nan")
        print(f"{r['concurrency']:>4} {r['requests']:>4} {r['ttfa_p50_s']:>8.3f}s {r['ttfa_p90_s']:>8.3f}s "
              f"{r['rtf_p50']:>8.3f} {r['rtf_p90']:>8.3f} {r['audio_s_per_wall_s']:>9.2f} "
              f"{r['continuity_ok']:>8.2f} {r['acceptance_rate'] or float('nan'):>6.2f}  "
              f"{ratio_ttfa:.2f} / {ratio_rtf:.2f}")


def main(args: argparse.Namespace) -> int:
    import tempfile

    args.out.mkdir(parents=True, exist_ok=True)
    process = None
    with tempfile.TemporaryDirectory() as data_dir:
        url = args.url
        if url is None:
            process, url = start_server(args, Path(data_dir))
        try:
            model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]
            rows = []
            for concurrency in args.concurrency:
                requests = args.requests or max(4, 2 * concurrency)
                print(f"[load] concurrency {concurrency}: {requests} requests", flush=True)
                rows.append(asyncio.run(run_level(url, concurrency, requests, args)))
        finally:
            if process is not None:
                process.terminate()
                process.wait(timeout=60)
    print_table(rows)
    report = {"model": model, "format": args.format, "acceptance": args.acceptance, "rows": rows,
              "cpu_count": os.cpu_count()}
    (args.out / "load.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out / 'load.json'}")
    return 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(_parser)
    raise SystemExit(main(_parser.parse_args()))
