"""The first hour, measured: `make serve` in a fresh clone, from nothing to the ready line.

    .venv/bin/python -m pcgtts.bench.first_run --out bench/results/install/first_run.json

Clones this repository's HEAD into a temporary folder, runs `make serve` there (with PCGTTS_PORT set to a
free port), timestamps every line it prints, stops the server at the ready line ("ready: open ..."), and
writes the seconds to the ready line, the seconds per install stage ("==> [n/4]" lines), the longest
stretch without output, and the size of the clone's .venv. Runs with the system's python3 and pip
configuration (pip.conf mirrors, caches): say which when quoting the numbers. The measuring process itself
runs from an installed checkout (it records the machine and writes results with bench/common.py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from pcgtts.bench.common import machine, write_json

ROOT = Path(__file__).resolve().parents[1]
READY = "ready: open"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def folder_bytes(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def first_run(clone: Path, timeout_s: float) -> dict:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PCGTTS_", "VIRTUAL_ENV"))}
    env.update(PCGTTS_PORT=str(port), PCGTTS_DATA_DIR=str(clone / "data"))
    started = time.monotonic()
    make = subprocess.Popen(["make", "serve"], cwd=clone, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    lines: list[tuple[float, str]] = []
    ready_s = None
    try:
        for line in make.stdout:
            now = time.monotonic() - started
            lines.append((round(now, 2), line.rstrip("\n")))
            if READY in line:
                ready_s = now
                break
            if now > timeout_s:
                break
    finally:
        os.killpg(make.pid, signal.SIGINT)
        try:
            make.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(make.pid, signal.SIGKILL)
    gaps = [(b[0] - a[0], a[1][:160], b[1][:160]) for a, b in zip(lines, lines[1:], strict=False)]
    longest = max(gaps, default=(0.0, "", ""))
    stages = [(t, text.split("==> ", 1)[1]) for t, text in lines if text.startswith("==> [")]
    installed_s = next((t for t, text in lines if text.startswith("==> installed")), None)
    return {
        "seconds_to_ready_line": None if ready_s is None else round(ready_s, 1),
        "seconds_to_installed": installed_s,
        "stages": [{"stage": name, "started_s": t} for t, name in stages],
        "longest_silence_s": round(longest[0], 1), "longest_silence_between": list(longest[1:]),
        "output_lines": len(lines),
        "venv_bytes": folder_bytes(clone / ".venv"),
        "venv_du_kib": int(subprocess.run(["du", "-sk", str(clone / ".venv")], capture_output=True,
                                          text=True).stdout.split()[0]),
        "ready_line": next((text for _, text in lines if READY in text), None),
        "output": [f"{t:7.2f}  {text}" for t, text in lines],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--timeout", type=float, default=1800.0, help="give up after this many seconds")
    parser.add_argument("--note", default="", help="conditions worth recording (pip mirrors, caches, load)")
    args = parser.parse_args()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="pcgtts-first-run-") as tmp:
        clone = Path(tmp) / "pcgtts"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        subprocess.run(["git", "checkout", "--quiet", head], cwd=clone, check=True)
        load_before = os.getloadavg()[0]
        result = first_run(clone, args.timeout)
    result.update(commit=head, command="make serve (fresh clone)", machine=machine(), note=args.note,
                  date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                  load_average_1min={"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)})
    result["venv_gb"] = round(result["venv_bytes"] / 1e9, 2)
    write_json(args.out, result)
    print(json.dumps({k: result[k] for k in ("seconds_to_ready_line", "venv_gb", "longest_silence_s")}))
    return 0 if result["seconds_to_ready_line"] is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
