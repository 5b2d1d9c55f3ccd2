"""What the vLLM tests share: whether vLLM is installed, tiny checkpoints vLLM's CPU build can serve, and an
offline `LLM` over them.

Locally the tests skip without vLLM (`make install-vllm`); where PCGTTS_REQUIRE_SYSTEM_TESTS=1 (CI, whose
`make test` installs it) a missing vLLM fails them instead."""

from __future__ import annotations

from pathlib import Path

from system_support import require_package

# vLLM's CPU attention takes head sizes of 32 and up: hidden 64 over 2 heads.
TINY = {"hidden": 64, "heads": 2, "kv_heads": 1, "intermediate": 128}


def require_vllm() -> None:
    require_package("vllm", "vLLM", "make install-vllm")


def offline_llm(target: Path, draft: Path, gamma: int, settings: dict, **kw):
    """vLLM's LLM over token ids (no tokenizer), eager, float32, draft-model speculation with the draft's
    full distributions, pcgtts' verification settings in additional_config."""
    from vllm import LLM

    return LLM(model=str(target), skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
               kv_cache_memory_bytes=64 << 20, max_model_len=256, seed=0, disable_log_stats=False,
               speculative_config={"model": str(draft), "method": "draft_model",
                                   "num_speculative_tokens": gamma, "draft_sample_method": "probabilistic"},
               additional_config={"pcgtts": settings}, **kw)


def shutdown(llm) -> None:
    """Stops the LLM's engine-core and worker processes now (not at interpreter exit)."""
    llm.llm_engine.engine_core.shutdown()


def spec_counters(llm) -> dict[str, float]:
    """vLLM's spec-decode counters (drafts, draft tokens, accepted tokens) from its own metrics."""
    out = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode_num_") and hasattr(metric, "value"):
            out[metric.name.removeprefix("vllm:spec_decode_")] = metric.value
    return out
