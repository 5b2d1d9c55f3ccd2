"""Engine throughput: target-only, `exact` and `pcg` speculative decoding at several batch sizes, side by
side in one run, plus Hugging Face `transformers.generate` on the same target as a reference.

Modes run round-robin within each repeat (machines here are noisy) and the median wall time is reported.
Without --target a random pair is built in a temporary directory and the report says so: a target of
6 layers at d=384 and a 1-layer draft initialised from it (embeddings, head and first layer shared); the
target's later layers are damped (--residual-gain) so that the draft agrees with it part of the time, as
a trained draft would. Random models say nothing about speech quality, only about engine speed.

    pcgtts bench engine --out results/engine            # random pair
    pcgtts bench engine --target models/demo-en/target --draft models/demo-en/draft \
        --asg-table models/demo-en/asg.safetensors --out results/engine
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class BenchSetup:
    target: Path
    draft: Path | None
    asg_table: Path | None
    description: str


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", type=Path, help="target checkpoint dir (default: a random pair)")
    parser.add_argument("--draft", type=Path, help="draft checkpoint dir")
    parser.add_argument("--asg-table", type=Path, help="ASG table for pcg (default: built from the target)")
    parser.add_argument("--theta", type=float, default=0.25, help="θ for the ASG table built when none given")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--gamma", type=int, default=3, help="draft tokens per step (γ)")
    parser.add_argument("--max-tokens", type=int, default=128, help="generated tokens per request")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers.generate reference")
    parser.add_argument("--modes", nargs="+", default=["target-only", "exact", "pcg"])
    parser.add_argument("--layers", type=int, default=6, help="random pair: target layers")
    parser.add_argument("--hidden", type=int, default=384, help="random pair: target width")
    parser.add_argument("--vocab", type=int, default=2048, help="random pair: vocabulary")
    parser.add_argument("--residual-gain", type=float, default=0.1, help="random pair: later-layer damping")
    parser.add_argument("--out", type=Path, help="write engine.json here")


def random_pair(root: Path, layers: int, hidden: int, vocab: int, residual_gain: float, seed: int = 0
                ) -> BenchSetup:
    """A random Llama target and a 1-layer draft sharing its embeddings, head and first layer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    heads = max(1, hidden // 64)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 8 // 3 // 64 * 64,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=max(1, heads // 3), max_position_embeddings=4096,
                      initializer_range=0.1, tie_word_embeddings=False)
    torch.manual_seed(seed)
    target = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in target.named_parameters():
            later = ".layers." in name and int(name.split(".")[2]) > 0
            if later and ("o_proj" in name or "down_proj" in name):
                p.mul_(residual_gain)
    target.save_pretrained(root / "target")
    cfg.num_hidden_layers = 1
    draft = LlamaForCausalLM(cfg).eval()
    draft.load_state_dict({k: v for k, v in target.state_dict().items()
                           if not k.startswith("model.layers.") or k.startswith("model.layers.0.")})
    draft.save_pretrained(root / "draft")
    desc = (f"random pair (no trained model yet): target {layers} layers d={hidden} vocab={vocab}, "
            f"draft 1 layer from the target, later target layers damped x{residual_gain}")
    return BenchSetup(root / "target", root / "draft", None, desc)


def build_table(target: Path, theta: float, out: Path) -> Path:
    from asg_tables import build_asg
    from engine.model.loader import load_llama

    emb = load_llama(target, "cpu", "float32").embed
    build_asg(emb, theta, progress=False).save(out)
    return out


def make_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, length), generator=gen).tolist()


class EngineRunner:
    def __init__(self, mode: str, setup: BenchSetup, args):
        from engine import Engine, EngineConfig

        spec = mode != "target-only"
        self.mode = mode
        per_seq = args.prompt_len + args.max_tokens + 2 * args.gamma + 32
        self.engine = Engine(EngineConfig(
            target=setup.target, draft=setup.draft if spec else None,
            acceptance=mode if spec else "exact", asg_table=setup.asg_table,
            num_speculative_tokens=args.gamma if spec else 0, device=args.device, dtype=args.dtype,
            max_num_seqs=max(args.batch_sizes), kv_budget_tokens=max(args.batch_sizes) * per_seq))

    def run(self, prompts, params) -> tuple[float, int, dict]:
        before = self.engine.metrics()
        start = time.perf_counter()
        gens = self.engine.generate(prompts, params)
        _sync(self.engine.device)
        elapsed = time.perf_counter() - start
        after = self.engine.metrics()
        drafted = after.spec_drafted_tokens - before.spec_drafted_tokens
        accepted = after.spec_accepted_tokens - before.spec_accepted_tokens
        drafts = after.spec_num_drafts - before.spec_num_drafts
        stats = {"acceptance_rate": accepted / drafted if drafted else None,
                 "mean_accepted_len": 1 + accepted / drafts if drafts else 1.0,
                 "steps": after.steps - before.steps}
        return elapsed, sum(len(g.token_ids) for g in gens), stats


class HFRunner:
    mode = "transformers"

    def __init__(self, setup: BenchSetup, args):
        from transformers import LlamaForCausalLM

        from engine.model.loader import resolve_dtype

        device = torch.device(args.device)
        self.device = device
        self.model = LlamaForCausalLM.from_pretrained(setup.target, dtype=resolve_dtype(args.dtype, device))
        self.model.to(device).eval()

    @torch.inference_mode()
    def run(self, prompts, params) -> tuple[float, int, dict]:
        ids = torch.tensor(prompts, device=self.device)  # equal lengths: no padding needed
        sample = params.temperature > 0
        start = time.perf_counter()
        out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=params.max_tokens,
                                  min_new_tokens=params.max_tokens, do_sample=sample,
                                  temperature=params.temperature if sample else None, top_k=0,
                                  top_p=params.top_p if sample else None, pad_token_id=0)
        _sync(self.device)
        elapsed = time.perf_counter() - start
        return elapsed, (out.shape[1] - ids.shape[1]) * ids.shape[0], {}


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def run_bench(args, setup: BenchSetup, progress=print) -> list[dict]:
    """Rows: mode, batch, tokens_per_s (median), speedup over target-only in the same run, acceptance."""
    from engine import SamplingParams

    runners = [EngineRunner(mode, setup, args) for mode in args.modes]
    if not args.no_hf:
        runners.append(HFRunner(setup, args))
    vocab = runners[0].engine.vocab_size
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens,
                            seed=None)
    rows = []
    for batch in args.batch_sizes:
        prompts = make_prompts(batch, args.prompt_len, vocab, seed=batch)
        warm = SamplingParams(temperature=args.temperature, max_tokens=4)
        for r in runners:
            r.run(prompts, warm)
        times = {r.mode: [] for r in runners}
        tokens, stats = {}, {}
        for rep in range(args.repeats):
            for r in runners:
                elapsed, n, st = r.run(prompts, params)
                times[r.mode].append(elapsed)
                tokens[r.mode] = n
                stats.setdefault(r.mode, []).append(st)
            progress(f"batch {batch}: repeat {rep + 1}/{args.repeats} done")
        base = statistics.median(times["target-only"]) if "target-only" in times else None
        for r in runners:
            med = statistics.median(times[r.mode])
            st = stats[r.mode]
            acc = [s["acceptance_rate"] for s in st if s.get("acceptance_rate") is not None]
            rows.append({
                "mode": r.mode, "batch": batch, "tokens": tokens[r.mode], "median_s": med,
                "tokens_per_s": tokens[r.mode] / med,
                "speedup_vs_target_only": (base / med) if base else None,
                "acceptance_rate": statistics.mean(acc) if acc else None,
                "mean_accepted_len": statistics.mean(s["mean_accepted_len"] for s in st) if acc else None,
                "times_s": times[r.mode],
            })
    return rows


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'mode':<13}{'batch':>6}{'tok/s':>10}{'x target':>10}{'accept':>9}{'mean len':>10}"]
    for r in rows:
        acc = f"{r['acceptance_rate']:.3f}" if r["acceptance_rate"] is not None else "-"
        mlen = f"{r['mean_accepted_len']:.2f}" if r["mean_accepted_len"] is not None else "-"
        spd = f"{r['speedup_vs_target_only']:.2f}" if r["speedup_vs_target_only"] else "-"
        lines.append(f"{r['mode']:<13}{r['batch']:>6}{r['tokens_per_s']:>10.1f}{spd:>10}{acc:>9}{mlen:>10}")
    return "\n".join(lines)


def main(args) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        if args.target is None:
            setup = random_pair(Path(tmp), args.layers, args.hidden, args.vocab, args.residual_gain)
        else:
            setup = BenchSetup(args.target, args.draft, args.asg_table,
                               f"target {args.target}, draft {args.draft}")
        if "pcg" in args.modes and setup.asg_table is None:
            setup.asg_table = build_table(setup.target, args.theta, Path(tmp) / "bench.asg")
            setup.description += f"; ASG table built from the target's embeddings at θ={args.theta}"
        print(setup.description)
        rows = run_bench(args, setup)
    print(format_rows(rows))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {"setup": setup.description, "device": args.device, "gamma": args.gamma,
                "max_tokens": args.max_tokens, "prompt_len": args.prompt_len, "temperature": args.temperature,
                "threads": torch.get_num_threads()}
        (args.out / "engine.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    raise SystemExit(main(p.parse_args()))
