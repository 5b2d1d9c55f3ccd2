"""The engine and the codec side by side, as two threads of one process and as two processes.

Each side repeats its own work (a batch-16 PCG decode of the bundle's utterances; a 16-stream codec decode
fed 3 codes a step) after both have warmed up and met at a barrier; each reports the median seconds of its
repeats and the CPU it used per wall second. Alone, each side runs with the other idle. Modes alternate.

    python bench/results/codec-process/threads_vs_processes.py --rounds 3 --out bench/results/codec-process
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import torch


def engine_side():
    from pcgtts.bench.common import bundle_engine, speech_requests
    from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle

    bundle = ModelBundle.from_dir(DEFAULT_MODEL_DIR)
    engine = bundle_engine(bundle, "pcg")
    prompts, params = speech_requests(bundle, 16, 0.8, 150)
    engine.generate(*speech_requests(bundle, 1, 0.8, 20))
    return lambda: engine.generate(prompts, params)


def codec_side():
    from pcgtts.bench.codec_bench import _decode_steps, _load_codec

    codec = _load_codec(None)
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, codec.codebook_size, size=3 * codec.frame_rate) for _ in range(16)]
    return lambda: _decode_steps(codec, seqs, 3, True)


SIDES = {"engine": engine_side, "codec": codec_side}


def run_side(name: str, repeats: int, out, barrier) -> None:
    torch.set_num_threads(1)
    work = SIDES[name]()
    work()
    barrier.wait()
    times, cpu0, wall0 = [], time.thread_time(), time.perf_counter()
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    out.append({"side": name, "median_s": statistics.median(times), "repeats_s": times,
                "cpu_per_wall": (time.thread_time() - cpu0) / (time.perf_counter() - wall0)})


def one_mode(mode: str, repeats: int) -> list[dict]:
    if mode.startswith("alone"):
        out: list = []
        run_side(mode.split("-")[1], repeats, out, threading.Barrier(1))
        return out
    if mode == "threads":
        out, barrier = [], threading.Barrier(2)
        threads = [threading.Thread(target=run_side, args=(n, repeats, out, barrier)) for n in SIDES]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out
    context = mp.get_context("spawn")
    with context.Manager() as manager:
        out, barrier = manager.list(), manager.Barrier(2)
        procs = [context.Process(target=run_side, args=(n, repeats, out, barrier)) for n in SIDES]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        return list(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("bench/results/codec-process"))
    args = parser.parse_args()
    from pcgtts.bench.common import machine

    rows = []
    for r in range(args.rounds):
        for mode in ("alone-engine", "alone-codec", "threads", "processes"):
            for side in one_mode(mode, args.repeats):
                rows.append({"round": r + 1, "mode": mode.split("-")[0], **side})
                print(f"round {r + 1} {mode:12s} {side['side']:6s} {side['median_s']:.2f} s "
                      f"(CPU per wall s {side['cpu_per_wall']:.2f})", flush=True)
    summary = {}
    for side in SIDES:
        alone = {row["round"]: row["median_s"] for row in rows
                 if row["side"] == side and row["mode"] == "alone"}
        for mode in ("threads", "processes"):
            ratios = [row["median_s"] / alone[row["round"]] for row in rows
                      if row["side"] == side and row["mode"] == mode]
            summary[f"{side} {mode} / alone"] = {"median": statistics.median(ratios), "per_round": ratios}
    for key, value in summary.items():
        print(f"{key}: {value['median']:.2f}x ({', '.join(f'{x:.2f}' for x in value['per_round'])})")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "threads_vs_processes.json").write_text(json.dumps(
        {"command": "python bench/results/codec-process/threads_vs_processes.py --rounds "
                    f"{args.rounds} --repeats {args.repeats}", "machine": machine(), "rows": rows,
         "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
