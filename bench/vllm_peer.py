"""vLLM with pcgtts' plugin as rows of `pcgtts bench engine`, run in a subprocess by the Python of the
environment vLLM is installed in (the project's own after `make install-vllm`): vLLM keeps a core spinning
while it is loaded, so it cannot take turns with our runners in one process. It reads a JSON job from stdin
and prints one JSON line of results, and imports nothing of pcgtts: vLLM loads the plugin itself (its
`vllm.general_plugins` entry point), which applies the CPU expand fix in every vLLM process and verifies
with our rules where `additional_config["pcgtts"]` asks for them.

Job: {"target": dir, "draft": dir | null, "asg_table": file | null, "num_speculative_tokens": int,
      "prompts": {batch: [[ids]]}, "max_tokens": int, "temperature": float, "top_p": float, "repeats": int,
      "eager": bool,
      "dtype": str (default float32), "kv_cache_bytes": int (CPU), or "memory": the device memory share (0.3)}
Result: {"rows": [{"mode", "batch", "tokens", "times_s", "cpu_s", "samples" (the last repeat's token ids per
         prompt), "acceptance_rate", "tokens_per_verify_step"}], "version", "plugin"}
Modes: vllm (target only); with a draft vllm-exact (vLLM's draft-model speculation verified by its standard
sampler, which is our `exact`) and, with an ASG table and the plugin installed, vllm-pcg (the same
speculation verified by PCG inside vLLM). Draft sampling is probabilistic, so verification sees the draft's
distribution.
"""

from __future__ import annotations

import json
import sys
import time
from importlib import metadata


def plugin_installed() -> bool:
    return any(ep.name == "pcgtts" for ep in metadata.entry_points(group="vllm.general_plugins"))


def modes(job: dict) -> list[tuple[str, dict]]:
    out = [("vllm", {})]
    if not job.get("draft"):
        return out
    spec = {"model": job["draft"], "method": "draft_model", "draft_sample_method": "probabilistic",
            "num_speculative_tokens": job["num_speculative_tokens"]}
    out.append(("vllm-exact", {"speculative_config": spec,
                               "additional_config": {"pcgtts": {"acceptance": "exact"}}}))
    if job.get("asg_table") and plugin_installed():
        out.append(("vllm-pcg", {"speculative_config": spec, "additional_config": {
            "pcgtts": {"acceptance": "pcg", "asg_table": job["asg_table"]}}}))
    return out


def run(job: dict) -> dict:
    import vllm
    from vllm import LLM, SamplingParams

    longest = max(len(p) for ps in job["prompts"].values() for p in ps)
    # KV cache: a fixed size where the job gives one (CPU: a share of host RAM fails when other processes
    # hold it), else a share of the device's memory
    memory = {"kv_cache_memory_bytes": job["kv_cache_bytes"]} if job.get("kv_cache_bytes") else \
        {"gpu_memory_utilization": job.get("memory", 0.3)}
    common = dict(skip_tokenizer_init=True, dtype=job.get("dtype", "float32"), **memory,
                  max_model_len=longest + job["max_tokens"] + 2 * job["num_speculative_tokens"] + 16,
                  enforce_eager=job.get("eager", False), seed=0, disable_log_stats=False)
    params = SamplingParams(temperature=job["temperature"], top_p=job["top_p"], max_tokens=job["max_tokens"],
                            min_tokens=job["max_tokens"], ignore_eos=True, detokenize=False)
    warm = SamplingParams(temperature=job["temperature"], max_tokens=4, ignore_eos=True, detokenize=False)
    rows = []
    for mode, extra in modes(job):
        llm = LLM(model=job["target"], **common, **extra)
        for batch, prompts in job["prompts"].items():
            inputs = [{"prompt_token_ids": p} for p in prompts]
            llm.generate(inputs, warm, use_tqdm=False)
            before = spec_counters(llm)
            times, cpu = [], []
            for _ in range(job["repeats"]):
                start, start_cpu = time.perf_counter(), _process_cpu_seconds()
                outputs = llm.generate(inputs, params, use_tqdm=False)
                times.append(time.perf_counter() - start)
                cpu.append(_process_cpu_seconds() - start_cpu)
            after = spec_counters(llm)
            tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
            row = {"mode": mode, "batch": int(batch), "tokens": tokens, "times_s": times, "cpu_s": cpu,
                   "samples": [list(o.outputs[0].token_ids) for o in outputs], "acceptance_rate": None,
                   "tokens_per_verify_step": None}
            if extra:
                delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
                if delta.get("num_draft_tokens"):
                    row["acceptance_rate"] = delta["num_accepted_tokens"] / delta["num_draft_tokens"]
                    row["tokens_per_verify_step"] = 1 + delta["num_accepted_tokens"] / delta["num_drafts"]
            rows.append(row)
        llm.llm_engine.engine_core.shutdown()
        del llm
    return {"rows": rows, "version": vllm.__version__, "plugin": plugin_installed()}


def spec_counters(llm) -> dict[str, float]:
    """vLLM's own speculative-decoding counters (drafts, draft tokens, accepted tokens) so far."""
    return {m.name.removeprefix("vllm:spec_decode_"): m.value for m in llm.get_metrics()
            if m.name.startswith("vllm:spec_decode_num_") and hasattr(m, "value")}


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
