"""How close a batched forward's matrix products run to this core's arithmetic (issue 32's premise).

    python bench/results/capacity/roofline/roofline.py --rows 1 16 64 --repeats 200

On one torch thread: the fp32 rate of a 512 x 512 x 512 product (about this core's peak), then the shipped
target's products (every layer's qkv, o, gate_up and down, and the LM head, from models/demo-en/target's
config) at each row count, as MKL's fp32 product over the input-major weights and as fbgemm's fp16-weight
product (what the engine runs from 2 rows on), in GFLOP/s and in ms for one whole forward's products.
Writes OUT/roofline.json and OUT/roofline.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from pcgtts.bench.common import machine, write_json
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR


def seconds(fn, repeats: int) -> float:
    """Median seconds of fn over `repeats` calls in 5 timed rounds, after 10 untimed ones."""
    for _ in range(10):
        fn()
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        rounds.append((time.perf_counter() - start) / repeats)
    return statistics.median(rounds)


def target_shapes(model_dir: Path) -> list[tuple[int, int, int]]:
    """(in, out, count per forward) of the target's products."""
    cfg = json.loads((model_dir / "target" / "config.json").read_text())
    d, inner, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    head = d // cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * head
    return [(d, d + 2 * kv, layers), (d, d, layers), (d, 2 * inner, layers), (inner, d, layers),
            (d, cfg["vocab_size"], 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path("bench/results/capacity/roofline"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    peak = 2 * 512 ** 3 / seconds(lambda: a @ b, 20) / 1e9
    rows = []
    for m in args.rows:
        flops, fp32_s, fp16_s = 0.0, 0.0, 0.0
        for fan_in, fan_out, count in target_shapes(args.model):
            x, w = torch.randn(m, fan_in), torch.randn(fan_in, fan_out)  # input-major, as the engine keeps W
            packed = torch.ops.quantized.linear_prepack_fp16(w.t().contiguous().half().float(), None)
            fp32_s += count * seconds(lambda x=x, w=w: x @ w, args.repeats)
            fp16_s += count * seconds(lambda x=x, p=packed: torch.ops.quantized.linear_dynamic_fp16(x, p),
                                      args.repeats)
            flops += count * 2 * m * fan_in * fan_out
        rows.append({"rows": m, "gflop": flops / 1e9, "fp32_ms": 1e3 * fp32_s, "fp16_ms": 1e3 * fp16_s,
                     "fp32_gflops": flops / fp32_s / 1e9, "fp16_gflops": flops / fp16_s / 1e9,
                     "peak_ms": 1e3 * flops / (peak * 1e9)})
    command = ("python bench/results/capacity/roofline/roofline.py --rows " + " ".join(map(str, args.rows))
               + f" --repeats {args.repeats}")
    result = {"command": command, "machine": machine(), "peak_gflops": peak, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "roofline.json", result)
    lines = [f"# The target's products against this core's arithmetic (`{command}`)", "",
             f"Machine: {result['machine']}. One thread. A 512³ fp32 product: **{peak:.0f} GFLOP/s**.", "",
             "| rows | GFLOP a forward | fp32 ms | fp32 GFLOP/s | fbgemm fp16 ms | fp16 GFLOP/s "
             "| ms at the 512³ rate |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['rows']} | {r['gflop']:.3f} | {r['fp32_ms']:.2f} | {r['fp32_gflops']:.0f} | "
                     f"{r['fp16_ms']:.2f} | {r['fp16_gflops']:.0f} | {r['peak_ms']:.2f} |")
    (args.out / "roofline.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
