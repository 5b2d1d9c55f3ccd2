"""Voice agent over the WebSocket: how soon the first sentence is heard while an LLM still writes the rest.

Starts `pcgtts serve` as its own process (or targets a running server with --url). Each run opens a
WebSocket in sentence mode (`"flush": "sentence"`) and streams an answer the way an LLM does: pieces of
1-5 characters at --tokens-per-s (30 by default). Per run it records

* **first audio after the first sentence**: from sending the piece that holds the first sentence's final
  character to the first binary frame (the server needs the next word's first letter to know the sentence
  ended, so this includes waiting for it);
* the stall a listener would hear (a player that starts at the first frame, plays at 24 kHz and waits
  whenever it runs dry: `pcgtts bench load`'s measure), and the longest silence in the audio itself;
* with --barge-in, a second run per seed that sends `input.cancel` once audio plays: time from the cancel to
  the cancelled `audio.done`, and the audio still received after it.

Writes `voice_agent.json` (every run, medians and p95) under --out.

    pcgtts bench voice-agent --runs 20 --out bench/results/voice-agent
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from pcgtts.bench.common import machine as machine_record
from pcgtts.bench.common import write_json
from pcgtts.bench.served import OUTPUT_RATE, quantile, stall_seconds, start_server

TARGET_S = 0.5  # the bound on first audio after the first sentence's final character (p50)
# Written for this benchmark (in no training corpus): a short answer of four sentences.
ANSWER = ("Sure, I can help with that. The train to the harbour leaves at half past seven every morning. "
          "Tickets cost 4.50 at the station, or a little less online. Bring a warm coat, since the wind "
          "off the water is cold.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=None, help="a running server (default: start `pcgtts serve` here)")
    parser.add_argument("--model", default=None, help="model dir for the started server (default: embedded)")
    parser.add_argument("--runs", type=int, default=20, help="answers streamed, one after another")
    parser.add_argument("--tokens-per-s", type=float, default=30.0, help="the LLM's pace")
    parser.add_argument("--barge-in", action="store_true", help="also measure input.cancel per run")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="extra flag for the started server, e.g. --server-arg=--acceptance=exact")
    parser.add_argument("--out", type=Path, default=Path("bench/results/voice-agent"))


def llm_pieces(text: str, seed: int) -> list[str]:
    rng, pieces, i = random.Random(seed), [], 0
    while i < len(text):
        n = rng.randint(1, 5)
        pieces.append(text[i:i + n])
        i += n
    return pieces


def ws_url(url: str) -> str:
    return url.replace("http://", "ws://") + "/v1/audio/speech/stream"


def longest_silence_s(pcm: bytes) -> float:
    samples = np.abs(np.frombuffer(pcm, "<i2").astype(np.int32)) <= 1
    edges = np.flatnonzero(np.diff(np.concatenate([[0], samples.astype(np.int8), [0]])))
    return float((edges[1::2] - edges[::2]).max()) / OUTPUT_RATE if edges.size else 0.0


async def one_answer(url: str, seed: int, pace_s: float, cancel_after_s: float | None = None) -> dict:
    """Streams ANSWER at the LLM's pace on one socket; the receiving side runs beside the writer."""
    from websockets.asyncio.client import connect

    first_end = ANSWER.index(".") + 1  # the first sentence's final character
    pieces = llm_pieces(ANSWER, seed)
    async with connect(ws_url(url), max_size=None) as ws:
        json.loads(await ws.recv())  # session.created
        await ws.send(json.dumps({"type": "session.config", "flush": "sentence", "seed": seed}))
        marks: dict[str, float] = {}
        arrivals: list[tuple[float, int]] = []
        pcm = bytearray()

        async def write() -> None:
            start, sent = time.perf_counter(), 0
            for k, piece in enumerate(pieces):
                await asyncio.sleep(max(0.0, start + k * pace_s - time.perf_counter()))
                await ws.send(json.dumps({"type": "input.text", "text": piece}))
                sent += len(piece)
                if "final_char" not in marks and sent >= first_end:
                    marks["final_char"] = time.perf_counter()
                if "cancel" in marks:
                    return
            await ws.send(json.dumps({"type": "input.done"}))

        writer = asyncio.create_task(write())
        while True:
            message = await ws.recv()
            now = time.perf_counter()
            if isinstance(message, bytes):
                marks.setdefault("first_audio", now)
                arrivals.append((now, len(message)))
                pcm += message
                if cancel_after_s is not None and "cancel" not in marks and \
                        now - marks["first_audio"] >= cancel_after_s:
                    marks["cancel"] = time.perf_counter()
                    await ws.send(json.dumps({"type": "input.cancel"}))
                continue
            event = json.loads(message)
            if event["type"] == "error":
                raise RuntimeError(f"server error: {event['error']}")
            if event["type"] == "audio.done":
                marks["done"] = now
                break
        await writer
    t0 = arrivals[0][0] if arrivals else 0.0
    row = {"seed": seed, "first_audio_after_first_sentence_s": marks["first_audio"] - marks["final_char"],
           "audio_s": len(pcm) / 2 / OUTPUT_RATE, "cancelled": event["cancelled"],
           "ttfa_ms_server": event["ttfa_ms"]}
    if cancel_after_s is None:
        row["stall_s"] = stall_seconds([(t - t0, n) for t, n in arrivals])
        row["longest_silence_s"] = longest_silence_s(bytes(pcm))
    else:
        row["cancel_to_done_s"] = marks["done"] - marks["cancel"]
        row["audio_after_cancel_s"] = sum(n for t, n in arrivals if t > marks["cancel"]) / 2 / OUTPUT_RATE
    return row


def summary(rows: list[dict], key: str) -> dict:
    values = [r[key] for r in rows]
    return {"p50": statistics.median(values), "p95": quantile(values, 0.95), "min": min(values),
            "max": max(values)}


def machine() -> dict:
    """The bench machine (`bench step`'s record) and its load average: the machine is shared."""
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None
    record = {k: v for k, v in machine_record().items() if k != "torch_threads"}  # the server has its own
    return {**record, "load_average": load}


def main(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    at_start = machine()
    process = None
    with tempfile.TemporaryDirectory() as data_dir:
        url = args.url
        if url is None:
            process, url = start_server(args, Path(data_dir))
        try:
            model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]
            asyncio.run(one_answer(url, 10_000, 1 / args.tokens_per_s))  # warm-up, not counted
            rows, barge = [], []
            for seed in range(args.runs):
                rows.append(asyncio.run(one_answer(url, seed, 1 / args.tokens_per_s)))
                print(f"[voice-agent] run {seed}: first audio "
                      f"{rows[-1]['first_audio_after_first_sentence_s']:.3f} s after the first sentence",
                      flush=True)
                if args.barge_in:
                    barge.append(asyncio.run(one_answer(url, seed, 1 / args.tokens_per_s,
                                                        cancel_after_s=0.3)))
        finally:
            if process is not None:
                process.terminate()
                process.wait(timeout=60)
    cli = sys.argv[1:3] == ["bench", "voice-agent"]
    report = {
        "command": "pcgtts bench voice-agent " + " ".join(sys.argv[3 if cli else 1:]),
        "machine": at_start, "load_average_at_end": machine()["load_average"],
        "note": "a shared machine: other work ran beside this benchmark", "model": model,
        "answer": ANSWER, "tokens_per_s": args.tokens_per_s, "target_first_audio_p50_s": TARGET_S,
        "first_audio_after_first_sentence_s": summary(rows, "first_audio_after_first_sentence_s"),
        "stall_s": summary(rows, "stall_s"), "longest_silence_s": summary(rows, "longest_silence_s"),
        "runs": rows,
    }
    if barge:
        report["barge_in"] = {"cancel_to_done_s": summary(barge, "cancel_to_done_s"),
                              "audio_after_cancel_s": summary(barge, "audio_after_cancel_s"), "runs": barge}
    write_json(args.out / "voice_agent.json", report)
    first = report["first_audio_after_first_sentence_s"]
    print(f"first audio after the first sentence's final character: p50 {first['p50']:.3f} s, "
          f"p95 {first['p95']:.3f} s over {args.runs} runs (target p50 <= {TARGET_S} s); "
          f"wrote {args.out / 'voice_agent.json'}")
    return 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(_parser)
    raise SystemExit(main(_parser.parse_args()))
