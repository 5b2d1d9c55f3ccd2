"""Engine throughput: target-only, `exact` and `pcg` speculative decoding at several batch sizes, side by
side in one run, plus Hugging Face `transformers.generate` on the same target as a reference.

vLLM with pcgtts' plugin (target-only, exact, PCG: bench/vllm_peer.py) runs on the same model and prompts.

Modes run round-robin within each repeat (machines here are noisy) and the median wall time is reported;
vLLM runs in a subprocess once before and once after them.
Without --target a random pair of the --shape is built in a temporary directory and the report says so:
`tiny` is a target of 6 layers at d=384 with a 1-layer draft, `llasa-1b` the Llasa-1B shape (16 layers,
d=2048, GQA 32/8, 193,800 tokens, tied) with a 2-layer draft. The draft shares the target's embeddings,
head and first layers; the target's later layers are damped (--residual-gain) so that the draft agrees
with it part of the time, as a trained draft would. Random models say nothing about speech quality, only
about engine speed.

    pcgtts bench engine --out results/engine            # tiny random pair
    pcgtts bench engine --target models/demo-en/target --draft models/demo-en/draft \
        --asg-table models/demo-en/asg.safetensors --out results/engine
    (add --our-draft models/demo-en/draft-head: our engine speculates with the bundle's feature head while
    transformers' assisted generation and vLLM keep the Llama draft)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from pcgtts.bench.common import DecodeTally, machine, write_json


@dataclass
class BenchSetup:
    target: Path
    draft: Path | None
    asg_table: Path | None
    description: str


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", type=Path, help="target checkpoint dir (default: a random pair)")
    parser.add_argument("--draft", type=Path, help="draft checkpoint dir")
    parser.add_argument("--our-draft", type=Path,
                        help="the draft our engine's speculative modes use instead of --draft (e.g. the "
                        "bundle's feature head, which the peers cannot run); the peers keep --draft")
    parser.add_argument("--asg-table", type=Path, help="ASG table for pcg (default: built from the target)")
    parser.add_argument("--theta", type=float, help="θ of the ASG table built when none is given "
                        "(default: the shape's)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--num-speculative-tokens", type=int, default=3, help="draft tokens per step (γ)")
    parser.add_argument("--max-tokens", type=int, default=128, help="generated tokens per request")
    parser.add_argument("--prompt-len", type=int, default=64, help="random prompts: tokens per prompt")
    parser.add_argument("--speech-prompts", type=Path, metavar="BUNDLE",
                        help="prompts from this bundle's family and voices (the step benchmark's sentences) "
                        "instead of random tokens: the draft then agrees with the target as in real use")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers.generate reference")
    parser.add_argument("--no-hf-assisted", action="store_true",
                        help="skip transformers' assisted generation (the draft as assistant_model)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for every runner (0 = torch's default)")
    parser.add_argument("--decode-graphs", default="eager",
                        help="the engine's EngineConfig.decode_graphs (eager, compile, cuda_graphs, auto)")
    parser.add_argument("--modes", nargs="+", default=["target-only", "exact", "pcg"])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny", help="random pair: model shape")
    parser.add_argument("--residual-gain", type=float, default=0.1, help="random pair: later-layer damping")
    parser.add_argument("--vllm-python", type=Path, default=DEFAULT_VLLM_PYTHON,
                        help="Python of the environment vLLM is installed in (default: this one, after "
                        "make install-vllm); vLLM's rows are skipped, with the reason, where it has none")
    parser.add_argument("--vllm-eager", action="store_true", help="vLLM with enforce_eager")
    parser.add_argument("--vllm-rounds", type=int, choices=(0, 1, 2), default=2,
                        help="vLLM runs before and after our runners (2, cancels a steady drift), once "
                        "before them (1: a time-boxed GPU check), or not at all (0)")
    parser.add_argument("--out", type=Path, help="write engine.json here")


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
# Random-pair shapes. speech_offset: first speech token (ASG groups are built over [offset, vocab) only).
SHAPES = {
    "tiny": dict(layers=6, hidden=384, heads=6, kv_heads=2, intermediate=1024, vocab=2048, tie=False,
                 draft_layers=1, theta=0.25, speech_offset=0, rope_theta=10000.0, rope_scaling=None),
    "llasa-1b": dict(layers=16, hidden=2048, heads=32, kv_heads=8, intermediate=8192, vocab=193800, tie=True,
                     draft_layers=2, theta=0.08, speech_offset=128264, rope_theta=500000.0,
                     rope_scaling=LLAMA3_ROPE),
    # the llasa-1b code path on a CPU-sized model (gpu_check.sh's own test)
    "llasa-mini": dict(layers=2, hidden=128, heads=4, kv_heads=2, intermediate=256, vocab=193800, tie=True,
                       draft_layers=1, theta=0.3, speech_offset=128264, rope_theta=500000.0,
                       rope_scaling=LLAMA3_ROPE),
}


def random_pair(root: Path, shape: str, residual_gain: float, device: str = "cpu", seed: int = 0
                ) -> BenchSetup:
    """A random Llama target and a draft sharing its embeddings, head and first layers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    s = SHAPES[shape]
    cfg = LlamaConfig(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["intermediate"],
                      num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                      num_key_value_heads=s["kv_heads"], max_position_embeddings=131072, rms_norm_eps=1e-5,
                      initializer_range=0.1 if s["hidden"] < 1024 else 0.02, tie_word_embeddings=s["tie"],
                      rope_theta=s["rope_theta"], rope_scaling=s["rope_scaling"])
    torch.manual_seed(seed)
    with torch.device(device):  # a 1B model initialises in seconds on a GPU, minutes on a CPU
        target = LlamaForCausalLM(cfg).eval()
    keep = s["draft_layers"]
    with torch.no_grad():
        for name, p in target.named_parameters():
            later = ".layers." in name and int(name.split(".")[2]) >= keep
            if later and ("o_proj" in name or "down_proj" in name):
                p.mul_(residual_gain)
    target.save_pretrained(root / "target")
    cfg.num_hidden_layers = keep
    with torch.device(device):
        draft = LlamaForCausalLM(cfg).eval()
    draft.load_state_dict({k: v for k, v in target.state_dict().items()
                           if not k.startswith("model.layers.") or int(k.split(".")[2]) < keep}, strict=False)
    draft.save_pretrained(root / "draft")
    del target, draft
    desc = (f"random pair, shape {shape} (no trained model): target {s['layers']} layers "
            f"d={s['hidden']} vocab={s['vocab']}, draft = its first {keep} layer(s), later target layers "
            f"damped x{residual_gain}")
    return BenchSetup(root / "target", root / "draft", None, desc)


def build_table(target: Path, theta: float, out: Path, offset: int = 0, device: str = "cpu") -> Path:
    """ASG table from the target's input embeddings over tokens [offset, V)."""
    from pcgtts.asg_tables import build_asg
    from pcgtts.engine.model.config import LlamaConfig
    from pcgtts.engine.model.loader import load_llama

    vocab = LlamaConfig.from_dir(target).vocab_size
    emb = load_llama(target, device, "float32").embed[offset:]
    build_asg(emb, theta, offset=offset, vocab_size=vocab, device=device, progress=False).save(out)
    return out


# vLLM (with the plugin, `make install-vllm`) runs bench/vllm_peer.py in a subprocess on the same prompts.
# Never faked: without vLLM the rows say why they are missing.
DEFAULT_VLLM_PYTHON = Path(sys.executable)
VLLM_PEER_SCRIPT = Path(__file__).with_name("vllm_peer.py")


def vllm_job(args, setup: BenchSetup, prompts_by_batch: dict[int, list[list[int]]]) -> dict:
    return {"target": str(Path(setup.target).resolve()),
            "draft": str(Path(setup.draft).resolve()) if setup.draft and "exact" in args.modes else None,
            "asg_table": str(Path(setup.asg_table).resolve()) if setup.asg_table and "pcg" in args.modes
            else None,
            "num_speculative_tokens": args.num_speculative_tokens, "max_tokens": args.max_tokens,
            "temperature": args.temperature,
            "top_p": args.top_p, "repeats": args.repeats, "eager": args.vllm_eager,
            "prompts": prompts_by_batch}


def run_vllm_round(args, job: dict) -> dict | str:
    """One run of bench/vllm_peer.py (every mode and batch size, `repeats` each): its result, or why not."""
    import subprocess

    python = args.vllm_python
    if getattr(args, "device", "cpu").startswith("cuda"):
        job = {**job, "dtype": "bfloat16" if args.dtype == "auto" else args.dtype, "memory": 0.6}
    else:
        job = {**job, "kv_cache_bytes": 512 << 20}
    if python is None or not Path(python).exists():
        return f"no Python at {python}; not measured"
    has_vllm = "import importlib.util as u; print(bool(u.find_spec('vllm')))"
    probe = subprocess.run([str(python), "-c", has_vllm], capture_output=True, text=True)
    if probe.stdout.strip() != "True":
        return f"vLLM is not installed for {python} (make install-vllm); not measured"
    env = dict(os.environ)
    if args.threads:  # the same torch thread count as our runners
        env["OMP_NUM_THREADS"] = str(args.threads)
    done = subprocess.run([str(python), str(VLLM_PEER_SCRIPT)], input=json.dumps(job), capture_output=True,
                          text=True, env=env, timeout=3600)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        causes = [line.split("] ", 1)[-1] for line in lines if "Error:" in line or "memory" in line.lower()]
        why = " | ".join(dict.fromkeys(causes[-3:] or lines[-3:]))
        return f"vLLM peer failed (exit {done.returncode}): {why}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def vllm_rows(args, setup: BenchSetup, job: dict, rounds: list[dict | str]) -> list[dict]:
    """vLLM's rows from its rounds (run before and after our runners: vLLM keeps a core spinning while it is
    loaded, so it cannot take turns with them in one process; bracketing them cancels a steady drift of the
    machine). Per mode and batch size, the median over every round's repeats."""
    failed = next((r for r in rounds if isinstance(r, str)), None)
    if failed:
        return [{"mode": "vllm", "batch": b, "skipped": failed} for b in args.batch_sizes]
    rows = []
    peer = f"vLLM {rounds[0]['version']}" + (" with pcgtts' plugin (its CPU expand fix included)"
                                             if rounds[0]["plugin"] else " without pcgtts' plugin")
    for parts in zip(*(r["rows"] for r in rounds), strict=True):
        first, last = parts[0], parts[-1]
        times = [t for part in parts for t in part["times_s"]]
        cpu = [c for part in parts for c in part["cpu_s"]]
        med = statistics.median(times)
        rates = [part["acceptance_rate"] for part in parts if part["acceptance_rate"] is not None]
        per_step = [part["tokens_per_verify_step"] for part in parts
                    if part.get("tokens_per_verify_step") is not None]
        rows.append({"mode": first["mode"], "batch": first["batch"], "tokens": first["tokens"],
                     "median_s": med, "tokens_per_s": first["tokens"] / med,
                     "cpu_per_wall": statistics.median(cpu) / med, "times_s": times, "rounds": len(parts),
                     "acceptance_rate": statistics.mean(rates) if rates else None,
                     "tokens_per_verify_step": statistics.mean(per_step) if per_step else None,
                     "unlikely_token_share": unlikely_token_share(
                         setup.target, job["prompts"][first["batch"]], last["samples"], args.temperature),
                     "peer": peer})
    return rows


@functools.lru_cache(maxsize=1)
def _reference_model(target: Path):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(target, dtype=torch.float32).eval()


def unlikely_token_share(target: Path, prompts: list[list[int]], samples: list[list[int]],
                         temperature: float, floor: float = 1e-4) -> float:
    """Share of sampled tokens to which the target gives probability < floor at the temperature: about the
    same for every runner that draws from the target's distribution (a check on samplers, not a speed)."""
    model = _reference_model(target)
    low = total = 0
    with torch.inference_mode():
        for prompt, sample in list(zip(prompts, samples, strict=True))[:4]:  # 4 rows: a check, kept cheap
            ids = torch.tensor([prompt + sample])
            logits = model(ids).logits[0, len(prompt) - 1:-1]  # [len(sample), V]: the step of each token
            probs = torch.softmax(logits / max(temperature, 1e-6), dim=-1)
            picked = probs.gather(1, torch.tensor(sample)[:, None])[:, 0]
            low += int((picked < floor).sum())
            total += len(sample)
    return low / total if total else 0.0


def rows_vocab(setup: BenchSetup) -> int:
    from pcgtts.engine.model.config import LlamaConfig

    return LlamaConfig.from_dir(setup.target).vocab_size


def with_speedups(peer_rows: list[dict], ours: list[dict]) -> list[dict]:
    """A peer's speed-up over our target-only engine at the same batch size, measured in the same run."""
    base = {r["batch"]: r["tokens_per_s"] for r in ours
            if r["mode"] == "target-only" and not r.get("skipped")}
    for r in peer_rows:
        if not r.get("skipped") and r["batch"] in base:
            r["speedup"] = r["tokens_per_s"] / base[r["batch"]]
    return peer_rows


def make_prompts(n: int, length: int, vocab: int, seed: int = 0, bundle: Path | None = None
                 ) -> list[list[int]]:
    """n prompts: random tokens of one length, or a bundle's speech prompts (voice + sentence)."""
    if bundle is not None:
        from pcgtts.bench.common import speech_requests
        from pcgtts.tts.bundle import ModelBundle

        return speech_requests(ModelBundle.from_dir(bundle), n, temperature=1.0, max_tokens=1)[0]
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, length), generator=gen).tolist()


class EngineRunner:
    def __init__(self, mode: str, setup: BenchSetup, args, longest_prompt: int):
        from pcgtts.engine import Engine, EngineConfig

        spec = mode != "target-only"
        self.mode = mode
        per_seq = longest_prompt + args.max_tokens + 2 * args.num_speculative_tokens + 32
        self.engine = Engine(EngineConfig(
            target=setup.target, draft=(getattr(args, "our_draft", None) or setup.draft) if spec else None,
            acceptance=mode if spec else "exact", asg_table=setup.asg_table,
            num_speculative_tokens=args.num_speculative_tokens if spec else 0, device=args.device,
            dtype=args.dtype,
            decode_graphs=getattr(args, "decode_graphs", "eager"), max_num_seqs=max(args.batch_sizes),
            kv_budget_tokens=max(args.batch_sizes) * per_seq))

    def run(self, prompts, params) -> tuple[float, int, dict]:
        start = time.perf_counter()
        gens = self.engine.generate(prompts, params)
        _sync(self.engine.device)
        elapsed = time.perf_counter() - start
        tally = DecodeTally.of(gens)
        stats = {"acceptance_rate": tally.acceptance_rate,
                 "tokens_per_verify_step": tally.tokens_per_verify_step,
                 "samples": [list(g.token_ids) for g in gens]}
        return elapsed, tally.tokens, stats


class HFRunner:
    """transformers `generate` on the same target; with `assisted`, the draft as its assistant_model
    (transformers' own speculative decoding, which it runs for one sequence at a time only)."""

    def __init__(self, setup: BenchSetup, args, assisted: bool = False):
        from pcgtts.engine.model.loader import resolve_dtype
        from transformers import LlamaForCausalLM

        device = torch.device(args.device)
        self.device = device
        self.mode = "transformers-assisted" if assisted else "transformers"
        dtype = resolve_dtype(args.dtype, device)
        self.model = LlamaForCausalLM.from_pretrained(setup.target, dtype=dtype).to(device).eval()
        self.extra = {}
        if assisted:
            assistant = LlamaForCausalLM.from_pretrained(setup.draft, dtype=dtype).to(device).eval()
            assistant.generation_config.num_assistant_tokens = args.num_speculative_tokens
            assistant.generation_config.num_assistant_tokens_schedule = "constant"
            self.extra = {"assistant_model": assistant}

    def skip_reason(self, batch: int) -> str | None:
        if self.extra and batch > 1:
            return "transformers' assisted generation supports batch size 1 only"
        return None

    @torch.inference_mode()
    def run(self, prompts, params) -> tuple[float, int, dict]:
        # Prompts of unequal lengths are padded on the left (token 0, masked out), as generate expects.
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        sample = params.temperature > 0
        start = time.perf_counter()
        out = self.model.generate(ids, attention_mask=mask, max_new_tokens=params.max_tokens,
                                  min_new_tokens=params.max_tokens, do_sample=sample,
                                  temperature=params.temperature if sample else None, top_k=0,
                                  top_p=params.top_p if sample else None, pad_token_id=0, **self.extra)
        _sync(self.device)
        elapsed = time.perf_counter() - start
        return elapsed, (out.shape[1] - ids.shape[1]) * ids.shape[0], {"samples": out[:, width:].tolist()}


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def prompt_sets(args, setup: BenchSetup) -> dict[int, list[list[int]]]:
    """The prompts of each batch size, the same for every runner and peer."""
    vocab = rows_vocab(setup)
    return {b: make_prompts(b, args.prompt_len, vocab, seed=b, bundle=args.speech_prompts)
            for b in args.batch_sizes}


def run_bench(args, setup: BenchSetup, prompts_by_batch: dict[int, list[list[int]]], progress=print
              ) -> list[dict]:
    """Rows: mode, batch, tokens_per_s (median), speedup over target-only in the same run, acceptance_rate and
    tokens_per_verify_step (our engine's modes; means over the repeats)."""
    from pcgtts.engine import SamplingParams

    longest = max(len(p) for ps in prompts_by_batch.values() for p in ps)
    runners = [EngineRunner(mode, setup, args, longest) for mode in args.modes]
    if not args.no_hf:
        runners.append(HFRunner(setup, args))
    if not getattr(args, "no_hf_assisted", True) and setup.draft is not None:
        runners.append(HFRunner(setup, args, assisted=True))
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens,
                            seed=None)
    rows = []
    for batch in args.batch_sizes:
        prompts = prompts_by_batch[batch]
        warm = SamplingParams(temperature=args.temperature, max_tokens=4)
        skipped = {r.mode: r.skip_reason(batch) for r in runners if getattr(r, "skip_reason", None)}
        for mode, reason in skipped.items():
            if reason:
                rows.append({"mode": mode, "batch": batch, "skipped": reason})
        active = [r for r in runners if not skipped.get(r.mode)]
        for r in active:
            r.run(prompts, warm)
        times = {r.mode: [] for r in active}
        cpu = {r.mode: [] for r in active}
        tokens, stats = {}, {}
        for rep in range(args.repeats):
            for r in active:
                cpu_start = time.process_time()
                elapsed, n, st = r.run(prompts, params)
                cpu[r.mode].append(time.process_time() - cpu_start)
                times[r.mode].append(elapsed)
                tokens[r.mode] = n
                stats.setdefault(r.mode, []).append(st)
            progress(f"batch {batch}: repeat {rep + 1}/{args.repeats} done")
        base = statistics.median(times["target-only"]) if "target-only" in times else None
        for r in active:
            med = statistics.median(times[r.mode])
            st = stats[r.mode]
            acc = [s["acceptance_rate"] for s in st if s.get("acceptance_rate") is not None]
            rows.append({
                "mode": r.mode, "batch": batch, "tokens": tokens[r.mode], "median_s": med,
                "tokens_per_s": tokens[r.mode] / med,
                "cpu_per_wall": statistics.median(cpu[r.mode]) / med,
                "speedup": (base / med) if base else None,
                "acceptance_rate": statistics.mean(acc) if acc else None,
                "tokens_per_verify_step": statistics.mean(s["tokens_per_verify_step"] for s in st)
                if st[0].get("tokens_per_verify_step") else None,
                "unlikely_token_share": unlikely_token_share(setup.target, prompts, st[-1]["samples"],
                                                             args.temperature),
                "times_s": times[r.mode],
            })
    return rows


def format_rows(rows: list[dict]) -> str:
    header = ("mode", "batch", "tok/s", "x target", "accept", "tok/verify", "cpu/wall", "p<1e-4")
    lines = ["".join(f"{h:<22}" if i == 0 else f"{h:>{6 if i == 1 else 10}}" for i, h in enumerate(header))]
    for r in rows:
        if r.get("skipped"):
            lines.append(f"{r['mode']:<22}{r['batch']:>6}  skipped: {r['skipped']}")
            continue
        acc = f"{r['acceptance_rate']:.3f}" if r.get("acceptance_rate") is not None else "-"
        mlen = f"{r['tokens_per_verify_step']:.2f}" if r.get("tokens_per_verify_step") is not None else "-"
        spd = f"{r['speedup']:.2f}" if r.get("speedup") else "-"
        line = (f"{r['mode']:<22}{r['batch']:>6}{r['tokens_per_s']:>10.1f}{spd:>10}{acc:>9}{mlen:>10}"
                f"{r['cpu_per_wall']:>10.2f}")
        line += f"{r['unlikely_token_share']:>10.1%}"
        lines.append(line)
    return "\n".join(lines)


def markdown_table(rows: list[dict], repeats: int) -> str:
    lines = [f"| batch | runner | tokens/s (median of {repeats}) | x our target-only | drafts accepted "
             "| tokens per verify step | CPU s per wall s | sampled tokens with target p < 1e-4 |",
             "|" + " --- |" * 8]
    for r in sorted(rows, key=lambda r: r["batch"]):
        if r.get("skipped"):
            lines.append(f"| {r['batch']} | {r['mode']} | skipped: {r['skipped']} | | | | | |")
            continue
        acc = f"{r['acceptance_rate']:.2f}" if r.get("acceptance_rate") is not None else "—"
        spd = f"{r['speedup']:.2f}x" if r.get("speedup") else "—"
        step = r.get("tokens_per_verify_step")
        per_step = f"{step:.2f}" if step is not None else "—"
        lines.append(f"| {r['batch']} | {r['mode']} | {r['tokens_per_s']:.1f} | {spd} | {acc} | {per_step} "
                     f"| {r['cpu_per_wall']:.2f} | {r['unlikely_token_share']:.1%} |")
    return "\n".join(lines) + "\n"


def plot_rows(rows: list[dict], path: Path) -> None:
    """Tokens/s against batch size, one line per runner (log scales)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode in dict.fromkeys(r["mode"] for r in rows if not r.get("skipped")):
        pts = sorted((r["batch"], r["tokens_per_s"]) for r in rows
                     if r["mode"] == mode and not r.get("skipped"))
        ax.plot([b for b, _ in pts], [t for _, t in pts], marker="o", label=mode)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequences decoded together")
    ax.set_ylabel("generated tokens per second")
    ax.set_title("Engine throughput, same target and prompts")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(args) -> int:
    if getattr(args, "threads", 0):
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        shape = SHAPES[args.shape]
        if args.target is None:
            setup = random_pair(Path(tmp), args.shape, args.residual_gain, args.device)
        else:
            ours = f"; our engine drafts with {args.our_draft}" if args.our_draft else ""
            setup = BenchSetup(args.target, args.draft, args.asg_table,
                               f"target {args.target}, draft {args.draft}{ours}")
        if "pcg" in args.modes and setup.asg_table is None:
            theta = args.theta or shape["theta"]
            offset = shape["speech_offset"] if args.target is None else 0
            setup.asg_table = build_table(setup.target, theta, Path(tmp) / "bench.asg", offset, args.device)
            setup.description += f"; ASG table built from the target's embeddings at θ={theta}"
        print(setup.description)
        prompts_by_batch = prompt_sets(args, setup)
        job = vllm_job(args, setup, prompts_by_batch)
        vllm_rounds = getattr(args, "vllm_rounds", 2)
        before = run_vllm_round(args, job) if vllm_rounds else None
        rows = run_bench(args, setup, prompts_by_batch)
        if before is not None:
            # a second round only if the first ran (a missing environment is reported once)
            rounds = [before] if isinstance(before, str) or vllm_rounds == 1 else \
                [before, run_vllm_round(args, job)]
            rows += with_speedups(vllm_rows(args, setup, job, rounds), rows)
    print(format_rows(rows))
    if args.out:
        meta = {"setup": setup.description, "machine": machine(), "device": args.device,
                "num_speculative_tokens": args.num_speculative_tokens,
                "decode_graphs": getattr(args, "decode_graphs", "eager"),
                "max_tokens": args.max_tokens, "temperature": args.temperature,
                "prompts": (f"speech prompts of {args.speech_prompts}" if args.speech_prompts
                            else f"random, {args.prompt_len} tokens")}
        write_json(args.out / "engine.json", {"meta": meta, "rows": rows})
        (args.out / "table.md").write_text(markdown_table(rows, args.repeats))
        plot_rows(rows, args.out / "engine.png")
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    raise SystemExit(main(p.parse_args()))
