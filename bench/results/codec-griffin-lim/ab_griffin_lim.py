"""The streaming codec's Griffin-Lim of a git revision against this checkout's, side by side in one process.

    python bench/results/codec-griffin-lim/ab_griffin_lim.py --base 2e67a7e --streams 1 16 --seconds 4 \
        --repeats 6 --out bench/results/codec-griffin-lim

Loads `engine/codec/demo/griffinlim.py` as it was at BASE beside this checkout's and decodes the same random
code streams (fed 3 codes a step, as the TTS service feeds them, all streams in batched `decode_streams`
calls) with each module's `griffin_lim` in turn, repeat after repeat; checks the audio is the same bits;
reports codec seconds per repeat and audio seconds per codec second. Writes OUT/ab_griffin_lim.json and
OUT/ab_griffin_lim.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from pcgtts.bench.codec_bench import _decode_steps, _load_codec
from pcgtts.bench.common import machine, speedup_cell, write_json
from pcgtts.engine.codec.demo import griffinlim


def base_griffin_lim(revision: str):
    """`griffin_lim` of engine/codec/demo/griffinlim.py at `revision`."""
    source = subprocess.run(["git", "show", f"{revision}:engine/codec/demo/griffinlim.py"], check=True,
                            capture_output=True, text=True).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("griffinlim_base", f.name)
    module = importlib.util.module_from_spec(spec)
    sys.modules["griffinlim_base"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.griffin_lim


def decode_audio(codec, seqs: list[np.ndarray]) -> list[np.ndarray]:
    return [codec.decode(s) for s in seqs]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True)
    parser.add_argument("--streams", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    forms = {"base": base_griffin_lim(args.base), "this": griffinlim.griffin_lim}
    codec = _load_codec(None)
    rng = np.random.default_rng(0)
    frames = int(args.seconds * codec.frame_rate)
    rows = []
    for n in args.streams:
        seqs = [rng.integers(0, codec.codebook_size, size=frames) for _ in range(n)]
        audio = {}
        for name, form in forms.items():
            griffinlim.griffin_lim = form
            audio[name] = decode_audio(codec, seqs)
        same = all(np.array_equal(a, b) for a, b in zip(*audio.values(), strict=True))
        seconds = {name: [] for name in forms}
        for _ in range(args.repeats):
            for name, form in forms.items():
                griffinlim.griffin_lim = form
                seconds[name].append(_decode_steps(codec, seqs, 3, True))
        rows.append({"streams": n, "seconds": seconds, "same_audio": same})
        base, this = seconds["base"], seconds["this"]
        print(n, "streams: base / this per repeat",
              " ".join(f"{b / t:.2f}" for b, t in zip(base, this, strict=True)), "same audio", same,
              flush=True)
    griffinlim.griffin_lim = forms["this"]
    result = {"command": "python bench/results/codec-griffin-lim/ab_griffin_lim.py " + " ".join(
        f"--{k} {' '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in vars(args).items()),
        "machine": machine(), "seconds_per_stream": args.seconds, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "ab_griffin_lim.json", result)
    lines = [f"# `{result['command']}`", "", f"Machine: {result['machine']}", "",
             "| streams | codec s, base | codec s, this | base / this (range over repeats) "
             "| audio s per codec s | same audio |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        base, this = r["seconds"]["base"], r["seconds"]["this"]
        lines.append(f"| {r['streams']} | {statistics.median(base):.2f} | {statistics.median(this):.2f} | "
                     f"{speedup_cell(base, this)} | "
                     f"{r['streams'] * args.seconds / statistics.median(base):.1f} → "
                     f"{r['streams'] * args.seconds / statistics.median(this):.1f} | "
                     f"{'yes' if r['same_audio'] else 'NO'} |")
    (args.out / "ab_griffin_lim.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
