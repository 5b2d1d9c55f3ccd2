"""What the benchmarks that drive a running server share (`bench load`, `bench voice-agent`): starting a
`pcgtts serve` to measure, the simulated player's stalls, and nearest-rank quantiles."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

OUTPUT_RATE = 24000  # samples per second of the PCM the benchmarks request


def stall_seconds(arrivals: list[tuple[float, int]], rate: int = OUTPUT_RATE) -> float:
    """Total time a player waits when it starts at the first byte, plays 16-bit mono at `rate` and pauses
    whenever its buffer runs dry. arrivals: (seconds since sent, bytes), in order."""
    return sum(wait for _, _, wait in stall_events(arrivals, rate))


def stall_events(arrivals: list[tuple[float, int]],
                 rate: int = OUTPUT_RATE) -> list[tuple[int, float, float]]:
    """Where that player waits: (index of the chunk it waited for, seconds of audio played before, wait)."""
    if not arrivals:
        return []
    clock = arrivals[0][0]  # when the buffered audio runs out
    played, events = 0.0, []
    for i, (t, n) in enumerate(arrivals):
        if t > clock:
            events.append((i, round(played, 3), t - clock))
            clock = t
        clock += n / 2 / rate
        played += n / 2 / rate
    return events


def quantile(values: list[float], q: float) -> float | None:
    """Nearest-rank quantile (no interpolation: with few requests p95 is a real request's value)."""
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, max(0, -(-int(q * 1000) * len(values) // 1000) - 1))]


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
