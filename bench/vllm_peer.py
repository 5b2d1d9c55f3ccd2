"""vLLM's CPU build as a peer of `pcgtts bench engine`, run by the Python of vLLM's own environment
(`make install-vllm-peer`), never imported by pcgtts: it reads a JSON job from stdin and prints one JSON
line of results. Only vLLM and the standard library are used here.

Job: {"target": dir, "draft": dir | null, "num_speculative_tokens": int, "prompts": {batch: [[token ids]]},
      "max_tokens": int, "temperature": float, "top_p": float, "repeats": int, "eager": bool}
Result: {"rows": [{"mode", "batch", "tokens", "times_s", "cpu_s", "samples" (the last repeat's token ids per
         prompt), "acceptance_rate"}], "version", "patched"}
Modes: vllm-cpu (target only) and, with a draft, vllm-cpu-spec (vLLM's draft-model speculation, γ drafts,
probabilistic draft sampling so that its rejection sampling sees the draft's distribution).

vLLM 0.32's CPU fallback of its Triton "expand" kernel never writes float outputs, so at temperature > 0
the per-token temperatures its speculative sampler reads are uninitialised memory (most sampled tokens
then have target probability < 1e-4). The fallback is replaced by an equivalent
`repeat_interleave`, in this process and in vLLM's spawned engine process, before the engine starts; the
result says so (`patched`).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time


def patch_expand_fallback() -> bool:
    """Replace vLLM's CPU fallback of its expand kernel with a correct one in this process; False if it is
    not there. (The fallback casts its float output to int64 and writes into that copy.)"""
    try:
        from vllm.utils import cpu_triton_utils as fallback
    except ImportError:
        return False
    if not hasattr(fallback, "_expand_kernel_impl"):
        return False
    import torch

    def expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
        # Row i's value over its tokens cu[i-1]..cu[i], replace_from -> replace_to, as the Triton kernel does.
        ends = cu_num_tokens.to(torch.long)
        counts = torch.diff(ends, prepend=ends.new_zeros(1))
        values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
        output[: int(ends[-1])] = torch.repeat_interleave(values, counts).to(output.dtype)

    fallback._expand_kernel_impl = expand
    return True


def patch_spawned_processes() -> None:
    """vLLM's engine core runs in a spawned process that registers the CPU fallbacks itself: a
    sitecustomize on its PYTHONPATH applies the same patch there before anything registers."""
    here = os.path.dirname(os.path.abspath(__file__))
    site = tempfile.mkdtemp(prefix="vllm-peer-site-")
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(f"import sys\nsys.path.insert(0, {here!r})\n"
                "import vllm_peer\nvllm_peer.patch_expand_fallback()\n")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [site, os.environ.get("PYTHONPATH")]))


def run(job: dict) -> dict:
    import vllm
    from vllm import LLM, SamplingParams

    patched = patch_expand_fallback()
    if patched:
        patch_spawned_processes()
    longest = max(len(p) for ps in job["prompts"].values() for p in ps)
    common = dict(skip_tokenizer_init=True, dtype="float32", gpu_memory_utilization=job.get("memory", 0.3),
                  max_model_len=longest + job["max_tokens"] + 2 * job["num_speculative_tokens"] + 16,
                  enforce_eager=job.get("eager", False), seed=0, disable_log_stats=False)
    modes = [("vllm-cpu", {})]
    if job.get("draft"):
        modes.append(("vllm-cpu-spec", {"speculative_config": {
            "model": job["draft"], "method": "draft_model",
            "num_speculative_tokens": job["num_speculative_tokens"],
            "draft_sample_method": "probabilistic"}}))
    params = SamplingParams(temperature=job["temperature"], top_p=job["top_p"], max_tokens=job["max_tokens"],
                            min_tokens=job["max_tokens"], ignore_eos=True, detokenize=False)
    warm = SamplingParams(temperature=job["temperature"], max_tokens=4, ignore_eos=True, detokenize=False)
    rows = []
    for mode, extra in modes:
        llm = LLM(model=job["target"], **common, **extra)
        for batch, prompts in job["prompts"].items():
            inputs = [{"prompt_token_ids": p} for p in prompts]
            llm.generate(inputs, warm, use_tqdm=False)
            times, cpu = [], []
            for _ in range(job["repeats"]):
                start, start_cpu = time.perf_counter(), _process_cpu_seconds()
                outputs = llm.generate(inputs, params, use_tqdm=False)
                times.append(time.perf_counter() - start)
                cpu.append(_process_cpu_seconds() - start_cpu)
            tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
            rows.append({"mode": mode, "batch": int(batch), "tokens": tokens, "times_s": times, "cpu_s": cpu,
                         "samples": [list(o.outputs[0].token_ids) for o in outputs],
                         "acceptance_rate": spec_acceptance(llm) if extra else None})
        del llm
    return {"rows": rows, "version": vllm.__version__, "patched": patched}


def spec_acceptance(llm) -> float | None:
    """Accepted / drafted tokens so far, from vLLM's own speculative-decoding counters."""
    counters = {m.name: m.value for m in llm.get_metrics() if hasattr(m, "value")}
    drafted = counters.get("vllm:spec_decode_num_draft_tokens")
    accepted = counters.get("vllm:spec_decode_num_accepted_tokens")
    return accepted / drafted if drafted else None


def _process_cpu_seconds() -> float:
    """CPU time of this process and all its live children (vLLM's engine core is a child process that
    spins on a core of its own). psutil is one of vLLM's own dependencies."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.Error:  # a child that ended between listing and reading
            pass
    return total


if __name__ == "__main__":  # vLLM spawns worker processes: the guard is required
    print(json.dumps(run(json.load(sys.stdin))))
