"""Streaming codec cost: several streams decoded in batched `decode_streams` calls vs one stream at a
time, and the first audio block (codes needed and decode latency) for the codec's block schedule vs the
same with the conv decoder's full context read for the first block.

Streams are fed the same way the TTS service feeds them (a few codes per engine step). Both ways run
round-robin within each repeat and the median is reported, so the ratio is taken side by side.

    pcgtts bench codec --streams 1 4 8 16 --out bench/results/codec
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from pcgtts.bench.common import machine, write_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=None, help="bundle dir (default: the embedded model)")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--seconds", type=float, default=4.0, help="audio per stream")
    parser.add_argument("--step-codes", type=int, default=3, help="codes fed per stream per step")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--ttfa-requests", type=int, default=0,
                        help="also time first audio through the TTS service (engine included) for each block "
                             "schedule, this many requests each, alternating")
    parser.add_argument("--out", type=Path, default=Path("bench/results/codec"))


def _load_codec(model: Path | None):
    from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle

    return ModelBundle.from_dir(model or DEFAULT_MODEL_DIR).load_codec()


def _schedules(gl) -> dict:
    """The codec's own block schedule ("shipped") and the same reading the conv decoder's full context for
    the first block ("full_context")."""
    return {"shipped": gl, "full_context": replace(gl, first_context=None)}


def _decode_steps(codec, seqs: list[np.ndarray], step: int, batched: bool) -> float:
    """Feeds every sequence `step` codes per step, then flushes; seconds of codec work."""
    streams = [codec.streaming_decoder() for _ in seqs]

    def decode(work: list) -> None:  # one call for all streams, or one call each
        if batched:
            codec.decode_streams(work)
        else:
            for one in work:
                codec.decode_streams([one])

    start = time.perf_counter()
    for pos in range(0, max(len(s) for s in seqs), step):
        decode([(st, s[pos: pos + step]) for st, s in zip(streams, seqs, strict=True) if pos < len(s)])
    decode([(st, None) for st in streams])
    return time.perf_counter() - start


def _first_audio(codec, codes: np.ndarray) -> tuple[int, float]:
    """(codes pushed one by one before the first audio, seconds the push that produced it took)."""
    stream = codec.streaming_decoder()
    for i in range(len(codes)):
        start = time.perf_counter()
        if stream.push(codes[i: i + 1]).size:
            return i + 1, time.perf_counter() - start
    return len(codes), 0.0


def _service_ttfa(model: Path | None, requests: int) -> dict:
    """Median seconds to the first audio chunk of one request at a time through the TTS service, shipped
    vs full-context first block, alternating request by request (same texts and seeds for both)."""
    import asyncio

    from pcgtts.tts import SynthesisOptions, TTSConfig, TTSService

    service = TTSService.load(TTSConfig(**({"model_dir": model} if model else {})))
    shipped = service.codec.gl
    schedules = _schedules(shipped)
    texts = ["The little boat drifted slowly towards the shore.", "Please bring the blue folder tomorrow.",
             "A quiet voice answered from the hall.", "We met at noon and walked to the market."]

    async def first_chunk(i: int) -> float:
        synth = service.synthesize(texts[i % len(texts)], None, SynthesisOptions(seed=i))
        start = time.perf_counter()
        async for _ in synth:
            break
        took = time.perf_counter() - start
        await synth.aclose()
        return took

    times: dict[str, list[float]] = {name: [] for name in schedules}
    try:
        for i in range(requests):
            for name, cfg in schedules.items():
                service.codec.gl = cfg
                times[name].append(asyncio.run(first_chunk(i)))
    finally:
        service.codec.gl = shipped
        service.close()
    out = {name: statistics.median(t) for name, t in times.items()}
    print(f"first audio through the service (median of {requests}): shipped {out['shipped']:.3f} s, "
          f"full context {out['full_context']:.3f} s", flush=True)
    return out | {"requests": requests}


def main(args: argparse.Namespace) -> int:
    run(args)
    return 0


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    codec = _load_codec(args.model)
    rng = np.random.default_rng(0)
    frames = int(args.seconds * codec.frame_rate)
    report: dict = {"codec": type(codec).__name__, "machine": machine(), "seconds_per_stream": args.seconds,
                    "step_codes": args.step_codes, "decode": [], "first_audio": []}
    for n in args.streams:
        seqs = [rng.integers(0, codec.codebook_size, size=frames) for _ in range(n)]
        times: dict[str, list[float]] = {"one_by_one": [], "batched": []}
        for _ in range(args.repeats):
            for mode in times:
                times[mode].append(_decode_steps(codec, seqs, args.step_codes, mode == "batched"))
        row = {"streams": n, **{f"{m}_s": statistics.median(t) for m, t in times.items()}}
        row["speedup"] = row["one_by_one_s"] / row["batched_s"]
        row["audio_s_per_codec_s"] = n * args.seconds / row["batched_s"]
        report["decode"].append(row)
        print(f"{n:3d} streams: one by one {row['one_by_one_s']:.2f} s, batched {row['batched_s']:.2f} s "
              f"({row['speedup']:.2f}x), {row['audio_s_per_codec_s']:.1f} audio-s per codec-s", flush=True)
    gl = getattr(codec, "gl", None)
    if gl is not None:  # the demo codec: shipped first block vs full context
        codes = rng.integers(0, codec.codebook_size, size=frames)
        for name, cfg in _schedules(gl).items():
            codec.gl = cfg
            runs = [_first_audio(codec, codes) for _ in range(args.repeats)]
            row = {"schedule": name, "first_block": cfg.first_block, "codes_before_audio": runs[0][0],
                   "first_push_s": statistics.median(r[1] for r in runs)}
            report["first_audio"].append(row)
            print(f"{name}: first audio after {row['codes_before_audio']} codes "
                  f"({row['codes_before_audio'] / codec.frame_rate:.2f} s of speech), that push took "
                  f"{row['first_push_s'] * 1e3:.0f} ms", flush=True)
        codec.gl = gl
        if args.ttfa_requests:
            report["service_ttfa"] = _service_ttfa(args.model, args.ttfa_requests)
    write_json(args.out / "codec.json", report)
    return report
