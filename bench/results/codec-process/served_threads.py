"""Where a served load's CPU goes, thread by thread: the engine thread, the codec thread(s), the event loop
(the server's main thread) and the codec process, read from /proc by the names the server gives its threads.

Starts `pcgtts serve` (with --codec-process MODE), warms it with one request per stream, then runs one
`pcgtts bench load` level of N streams; each thread's CPU seconds over that level, per second of the level's
wall time (cores) and per second of audio it produced. Linux only. Modes and levels alternate.

    python bench/results/codec-process/served_threads.py --modes process thread --streams 8 16 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of every thread of pid and its descendants, summed by thread name."""
    from pcgtts.bench.load_test import process_tree, stat_cpu_seconds

    out: dict[str, float] = {}
    for process in process_tree(pid):
        for task in Path(f"/proc/{process}/task").iterdir():
            try:
                name = (task / "comm").read_text().strip()
                out[name] = out.get(name, 0.0) + stat_cpu_seconds(task / "stat")
            except OSError:  # the thread ended meanwhile
                continue
    return out


def load_level(url: str, streams: int, per_client: int, out: Path) -> dict:
    subprocess.run([sys.executable, "-m", "pcgtts.cli", "bench", "load", "--url", url, "--concurrency",
                    str(streams), "--per-client", str(per_client), "--out", str(out)], check=True,
                   capture_output=True)
    return json.loads((out / "load.json").read_text())["rows"][0]


def one(mode: str, streams: int, port: int, scratch: Path) -> dict:
    server = subprocess.Popen([sys.executable, "-m", "pcgtts.cli", "serve", "--port", str(port),
                               "--log-level", "warning", f"--codec-process={mode}",
                               "--data-dir", str(scratch / "data")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        load_level(url, streams, 1, scratch / "warm")
        before = thread_cpu(server.pid)
        row = load_level(url, streams, 2, scratch / "level")
        after = thread_cpu(server.pid)
    finally:
        server.terminate()
        server.wait()
    spent = {name: after[name] - before.get(name, 0.0) for name in after}
    return {"mode": mode, "streams": streams, "wall_s": row["wall_s"], "audio_s": row["audio_s"],
            "audio_s_per_s": row["audio_s_per_wall_s"], "real_time": row["real_time"],
            "cores": {n: s / row["wall_s"] for n, s in sorted(spent.items()) if s > 0.01},
            "cpu_s_per_audio_s": {n: s / row["audio_s"] for n, s in sorted(spent.items()) if s > 0.01}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--modes", nargs="+", default=["process", "thread"])
    parser.add_argument("--streams", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--port", type=int, default=47211)
    parser.add_argument("--out", type=Path, default=Path("bench/results/codec-process"))
    args = parser.parse_args()
    from pcgtts.bench.common import machine

    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for r in range(args.rounds):
            for streams in args.streams:
                for mode in args.modes:
                    row = {"round": r + 1, **one(mode, streams, args.port, Path(scratch))}
                    rows.append(row)
                    cores = ", ".join(f"{n} {c:.2f}" for n, c in sorted(row["cores"].items(),
                                                                          key=lambda kv: -kv[1]))
                    print(f"round {r + 1} {mode:7s} {streams:2d} streams: {row['audio_s_per_s']:.1f} s of "
                          f"audio per s; cores: {cores}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "served_threads.json").write_text(json.dumps(
        {"command": "python bench/results/codec-process/served_threads.py " + " ".join(sys.argv[1:]),
         "machine": machine(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
