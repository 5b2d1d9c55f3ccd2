"""How long does `verify` take next to the target forward pass it follows? And what does an ASG build cost?

    pcgtts bench verify [--reps 15] [--out bench/results]   # verify vs forward (~2-4 min)
    pcgtts bench verify --build [--dim 2048]                # 65,536 x 2,048 ASG build (minutes)
    pcgtts bench verify --model models/demo-en              # the bundle's own steps (~1 min)

Verify: B in {1, 16, 64}, γ = 3, V = 65,536 (X-codec2), rules exact / pcg (ASG tables of mean group size ~10
and ~140) / ssd / topk / lantern, plus V = 193,800 (Llasa's full vocabulary, speech tokens a subrange).
ASG tables come from random low-dimensional embeddings with θ tuned to the wanted mean size (overlapping
cosine neighbourhoods, like real ones). Distributions: target logits ~ N(0, 3²) per token, draft logits =
target + N(0, 1.5²), so acceptance is moderate and the rejection paths run.

Forward: one target verify step of a Llama-3.2-1B-shaped model (d = 2,048, 32 heads / 8 KV heads of 64, ffn
8,192, 16 layers) on γ+1 = 4 new tokens per sequence over a 512-token KV context, float32 on the CPU. A few
layers are timed and scaled to 16; the LM head (2,048 x 193,800) is timed once and added.

Timings are medians over repeats measured in the same process; results go to OUT/verify_speed.json (and
OUT/asg_build.json with --build). With --model: every rule on the bundle's own decode steps
(bench/bundle_verify.py), OUT/verify_bundle.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from pcgtts.asg_tables import ASGTable, build_asg
from pcgtts.asg_tables.build import normalized_rows
from pcgtts.bench.common import machine, write_json
from pcgtts.engine.acceptance import make_rule
from pcgtts.engine.acceptance.warp import logits_to_probs

GAMMA = 3
SPEECH_V = 65_536
LLASA_V, LLASA_OFFSET = 193_800, 128_264
LLAMA_1B = {"d": 2048, "heads": 32, "kv_heads": 8, "ffn": 8192, "layers": 16}


def median_ms(fn, reps: int, warmup: int = 2) -> tuple[float, float]:
    """(median, inter-quartile range) of fn() wall time in milliseconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return statistics.median(times), q[2] - q[0]


# ---- ASG tables of a chosen mean group size ----------------------------------------------------------
def theta_for_mean_size(emb: torch.Tensor, target: float, sample: int = 2048) -> float:
    """θ whose seed groups average `target` tokens, estimated on a row sample against all rows."""
    unit = normalized_rows(emb)
    rows = unit[torch.randperm(unit.shape[0], generator=torch.Generator().manual_seed(0))[:sample]]
    sims = torch.sort(rows @ unit.T, dim=1, descending=True).values  # [sample, V]
    # mean |G(t)| at θ = mean over rows of #{sim >= θ}; pick θ as the matching quantile of all sims
    flat = sims.flatten()
    k = int(round(target * sample))
    return float(torch.topk(flat, k).values[-1])


def synthetic_table(
    mean_size: float, vocab: int = SPEECH_V, dim: int = 8, offset: int = 0, full_vocab: int | None = None
) -> ASGTable:
    emb = torch.randn(vocab, dim, generator=torch.Generator().manual_seed(int(mean_size)))
    theta = theta_for_mean_size(emb, mean_size)
    return build_asg(emb, theta, offset=offset, vocab_size=full_vocab, progress=False)


# ---- verify -------------------------------------------------------------------------------------------
def verify_inputs(batch: int, vocab: int, seed: int, speech: tuple[int, int] | None = None):
    """(draft_tokens, draft_probs, target_probs) with moderate agreement; optional speech-only support."""
    gen = torch.Generator().manual_seed(seed)
    logits_q = 3.0 * torch.randn(batch, GAMMA + 1, vocab, generator=gen)
    logits_p = logits_q[:, :GAMMA] + 1.5 * torch.randn(batch, GAMMA, vocab, generator=gen)
    if speech is not None:  # the engine masks non-speech tokens; here all but the speech range get -inf
        mask = torch.full((vocab,), float("-inf"))
        mask[speech[0] : speech[1]] = 0.0
        logits_q, logits_p = logits_q + mask, logits_p + mask
    q = logits_to_probs(logits_q, temperature=0.8)
    p = logits_to_probs(logits_p, temperature=0.8)
    x = torch.multinomial(p.view(-1, vocab), 1, generator=gen).view(batch, GAMMA)
    return x, p, q


def bench_verify(
    rules: dict, batches: list[int], vocab: int, reps: int, speech: tuple[int, int] | None = None
) -> list[dict]:
    rows = []
    for b in batches:
        x, p, q = verify_inputs(b, vocab, seed=b, speech=speech)
        for name, rule in rules.items():
            gen = torch.Generator().manual_seed(0)
            accepted = []

            def step(rule=rule, gen=gen, accepted=accepted, x=x, p=p, q=q):
                accepted.append(rule.verify(x, p, q, gen).num_accepted.double().mean().item())

            med, iqr = median_ms(step, reps)
            rows.append(
                {
                    "rule": name,
                    "B": b,
                    "V": vocab,
                    "verify_ms": round(med, 3),
                    "iqr_ms": round(iqr, 3),
                    "mean_accepted": round(statistics.mean(accepted), 3),
                }
            )
            print(
                f"  verify {name:>14} B={b:<3} V={vocab}: {med:8.3f} ms (IQR {iqr:.3f}), "
                f"mean accepted {rows[-1]['mean_accepted']:.2f}",
                flush=True,
            )
    return rows


# ---- a Llama-3.2-1B-shaped verify forward --------------------------------------------------------------
class LlamaLayer(torch.nn.Module):
    """Decoder layer with Llama-3.2-1B shapes: RMSNorm, GQA attention over a KV cache, SwiGLU MLP."""

    def __init__(self, d: int, heads: int, kv_heads: int, ffn: int):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.qkv = torch.nn.Linear(d, (heads + 2 * kv_heads) * self.hd, bias=False)
        self.o = torch.nn.Linear(d, d, bias=False)
        self.gate_up = torch.nn.Linear(d, 2 * ffn, bias=False)
        self.down = torch.nn.Linear(ffn, d, bias=False)
        self.n1, self.n2 = torch.nn.RMSNorm(d), torch.nn.RMSNorm(d)

    def forward(self, h: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        b, t, d = h.shape  # new tokens t over a cache of c tokens: k_cache [B, kv_heads, c, hd]
        q, k, v = self.qkv(self.n1(h)).split(
            [self.heads * self.hd, self.kv_heads * self.hd, self.kv_heads * self.hd], dim=-1
        )
        q = q.view(b, t, self.heads, self.hd).transpose(1, 2)
        k = torch.cat([k_cache, k.view(b, t, self.kv_heads, self.hd).transpose(1, 2)], dim=2)
        v = torch.cat([v_cache, v.view(b, t, self.kv_heads, self.hd).transpose(1, 2)], dim=2)
        c = k_cache.shape[2]
        causal = torch.ones(t, c + t, dtype=torch.bool).tril(diagonal=c)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=causal, enable_gqa=True)
        h = h + self.o(att.transpose(1, 2).reshape(b, t, d))
        gate, up = self.gate_up(self.n2(h)).chunk(2, dim=-1)
        return h + self.down(F.silu(gate) * up)


@torch.inference_mode()
def bench_forward(batches: list[int], reps: int, layers_timed: int = 2, context: int = 512) -> list[dict]:
    s = LLAMA_1B
    stack = [LlamaLayer(s["d"], s["heads"], s["kv_heads"], s["ffn"]) for _ in range(layers_timed)]
    head = torch.nn.Linear(s["d"], LLASA_V, bias=False)
    rows = []
    for b in batches:
        h = torch.randn(b, GAMMA + 1, s["d"])
        kc = torch.randn(b, s["kv_heads"], context, s["d"] // s["heads"])
        vc = torch.randn_like(kc)

        def layers(h=h, kc=kc, vc=vc):
            x = h
            for layer in stack:
                x = layer(x, kc, vc)
            return x

        layer_ms, _ = median_ms(layers, reps, warmup=1)
        head_ms, _ = median_ms(lambda h=h: head(h), reps, warmup=1)
        total = layer_ms / layers_timed * s["layers"] + head_ms
        rows.append(
            {
                "B": b,
                "tokens_per_seq": GAMMA + 1,
                "context": context,
                "layers_timed": layers_timed,
                "per_layer_ms": round(layer_ms / layers_timed, 3),
                "lm_head_ms": round(head_ms, 3),
                "forward_ms_scaled": round(total, 2),
            }
        )
        print(
            f"  forward B={b:<3}: {layer_ms / layers_timed:.2f} ms/layer x {s['layers']} "
            f"+ head {head_ms:.2f} ms = {total:.1f} ms",
            flush=True,
        )
    return rows


def bench_coarse(tables: dict[str, ASGTable], rows_list: list[int], reps: int) -> list[dict]:
    """Both coarse() methods on few rows; only the faster sparse product on many (index_add takes minutes)."""
    out = []
    for name, table in tables.items():
        for r in rows_list:
            probs = torch.softmax(torch.randn(r, table.vocab_size), dim=-1)
            for method in ("sparse", "index_add") if r == min(rows_list) else ("sparse",):
                med, _ = median_ms(lambda m=method, pr=probs, t=table: t.coarse(pr, method=m), reps, warmup=1)
                out.append({"table": name, "rows": r, "method": method, "ms": round(med, 3)})
                print(f"  coarse {name} rows={r:<3} {method:>9}: {med:8.2f} ms", flush=True)
    return out


# ---- the 65,536 x 2,048 build, in a child process so its peak RSS is its own ----------------------------
def ring_embeddings(n: int, dim: int, window: int, chunk: int = 4096) -> torch.Tensor:
    """e_i = r_i + ... + r_{i+window-1} (indices mod n), random r_j of norm ~1; bf16 like a checkpoint.

    Neighbouring tokens share window - |i - k| terms, so cos(e_i, e_k) ≈ 1 - |i - k|/window (noise sd ≈ 0.02)
    and G(i) at θ is the ~2(1 - θ)·window + 1 tokens around i: overlapping, all distinct, like real groups.
    Built in chunks so that the set-up never holds more than the bf16 result and one float32 chunk."""
    gen = torch.Generator().manual_seed(0)
    r = torch.empty(n, dim, dtype=torch.bfloat16)  # [n, D]
    for start in range(0, n, chunk):
        r[start : start + chunk] = torch.randn(min(chunk, n - start), dim, generator=gen) / dim**0.5
    out = torch.empty(n, dim, dtype=torch.bfloat16)
    for start in range(0, n, chunk):
        idx = torch.arange(start, min(start + chunk, n) + window - 1) % n
        csum = torch.cumsum(torch.cat([torch.zeros(1, dim), r[idx].float()]), dim=0)  # [c + window, D]
        c = min(chunk, n - start)
        out[start : start + c] = (csum[window : window + c] - csum[:c]).to(torch.bfloat16)
    return out


def build_child(dim: int, mean_size: int) -> dict:
    """θ = 0.4 over ring embeddings whose groups average `mean_size` tokens (nnz ≈ 65,536 · mean_size, as
    the paper's largest k̄ ≈ 140 gives ~9.2 M members)."""
    window = round((mean_size - 1) / (2 * 0.6))
    emb = ring_embeddings(SPEECH_V, dim, window)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    t0 = time.perf_counter()
    table = build_asg(emb, 0.4, offset=LLASA_OFFSET, vocab_size=LLASA_V)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    return {
        "V": SPEECH_V,
        "D": dim,
        "theta": 0.4,
        "build_s": round(seconds, 1),
        "threads": torch.get_num_threads(),
        "peak_rss_mib": round(peak, 1),
        "rss_before_build_mib": round(rss_before, 1),
        "mean_seed_group_size": table.meta["mean_seed_group_size"],
        "speech_groups": table.meta["num_speech_groups"],
        "nnz": int(table.group_members.numel()),
        "table_mib": round(table.nbytes() / 2**20, 2),
    }


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--build", action="store_true", help="time the 65,536 x D ASG build instead")
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--mean-size", type=int, default=140)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for every timing (default 1: on a shared 2-core box multi-threaded small "
        "ops stall on busy siblings; verify and forward always use the same setting)",
    )
    ap.add_argument("--model", type=Path, default=None,
                    help="time every rule on this bundle's own decode steps instead (speech prompts)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 6], help="with --model")
    ap.add_argument("--utterances", type=int, default=6, help="with --model: prompts decoded per batch size")
    ap.add_argument("--max-tokens", type=int, default=300, help="with --model")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)


def main(args: argparse.Namespace | list[str] | None = None) -> int:
    """args: parsed by `pcgtts bench verify`, or a command line (None: sys.argv) for `python -m`."""
    if not isinstance(args, argparse.Namespace):
        ap = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
        add_arguments(ap)
        args = ap.parse_args(args)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.model is not None:
        from pcgtts.bench import bundle_verify

        return bundle_verify.main(args)

    if args.child:
        print(json.dumps(build_child(args.dim, args.mean_size)))
        return 0
    if args.build:
        cmd = [
            sys.executable,
            "-m",
            "pcgtts.bench.verify_speed",
            "--child",
            "--dim",
            str(args.dim),
            "--mean-size",
            str(args.mean_size),
            "--threads",
            str(args.threads),
        ]
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        write_json(args.out / "asg_build.json", result)
        print(json.dumps(result, indent=2))
        return 0

    env = {
        "machine": machine(),
        "load_average_before": list(os.getloadavg()),
        "command": f"pcgtts bench verify --reps {args.reps} --threads {args.threads}",
    }
    print(f"building synthetic ASG tables (V = {SPEECH_V}) ...", flush=True)
    t10, t140 = synthetic_table(10), synthetic_table(140)
    t140_full = synthetic_table(140, offset=LLASA_OFFSET, full_vocab=LLASA_V)
    tables = {"k10": t10, "k140": t140}
    table_info = {
        n: {
            "mean_group_size": round(t.meta["mean_group_size"], 2),
            "mean_seed_group_size": round(t.meta["mean_seed_group_size"], 2),
            "theta": round(t.meta["theta"], 4),
            "groups": t.num_groups,
        }
        for n, t in tables.items()
    }
    with tempfile.TemporaryDirectory() as tmp:  # storage size and load time of the Llasa-vocabulary table
        path = Path(tmp) / "asg.safetensors"
        t140_full.save(path)
        load_ms, _ = median_ms(lambda: ASGTable.load(path), 5, warmup=1)
        table_info["k140_llasa_vocab"] = {
            "file_mib": round(path.stat().st_size / 2**20, 2),
            "load_ms": round(load_ms, 1),
            "groups": t140_full.num_groups,
        }
    print(json.dumps(table_info), flush=True)
    batches = [1, 16, 64]
    rules = {
        "exact": make_rule("exact"),
        "pcg-k10": make_rule("pcg", table=t10),
        "pcg-k140": make_rule("pcg", table=t140),
        "ssd-0.3": make_rule("ssd", bias=0.3),
        "topk-50": make_rule("topk", k=50),
        "lantern-k140": make_rule("lantern", k=1000, delta=0.1, table=t140),
    }
    verify = bench_verify(rules, batches, SPEECH_V, args.reps)
    full_rules = {"exact": make_rule("exact"), "pcg-k140": make_rule("pcg", table=t140_full)}
    verify += bench_verify(
        full_rules, [64], LLASA_V, args.reps, speech=(LLASA_OFFSET, LLASA_OFFSET + SPEECH_V)
    )
    pcg_stats = {n: dict(r.stats) for n, r in rules.items() if n.startswith("pcg")}
    forward = bench_forward(batches, 3)
    coarse = bench_coarse(tables, [4, 64], max(3, args.reps // 3))

    fwd = {r["B"]: r["forward_ms_scaled"] for r in forward}
    for r in verify:
        r["ratio_to_forward"] = round(r["verify_ms"] / fwd[r["B"]], 5)
    result = {
        "env": env,
        "tables": table_info,
        "verify": verify,
        "forward": forward,
        "coarse": coarse,
        "pcg_thinning": pcg_stats,
    }
    write_json(args.out / "verify_speed.json", result)
    print("\nrule            B   V       verify ms   forward ms   verify/forward")
    for r in verify:
        print(
            f"{r['rule']:<14} {r['B']:>3} {r['V']:>7} {r['verify_ms']:>10.3f} {fwd[r['B']]:>11.1f} "
            f"{100 * r['ratio_to_forward']:>12.2f}%"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
