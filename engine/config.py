"""Engine and per-request sampling configuration (public contract, exported by `engine`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.speech.base import DecodeConstraint


@dataclass
class EngineConfig:
    """How one engine instance loads its models and sizes its batch and KV cache.

    Every default works on a 2-core CPU with the embedded model. These defaults are the only ones: the TTS
    service's config (tts.TTSConfig) and the server's settings refer to them.
    """

    target: str | Path  # Hugging Face-format Llama directory (config.json + *.safetensors)
    draft: str | Path | None = None  # draft checkpoint sharing the target's vocabulary; None = target-only
    acceptance: str = "exact"  # rule name for engine.acceptance.make_rule
    acceptance_params: dict = field(default_factory=dict)  # extra rule parameters (ssd bias, topk k, ...)
    asg_table: str | Path | None = None  # ASG table for "pcg" / "lantern" (asg_tables.ASGTable.load)
    # More tables (e.g. other θ) that a request may pick by name for A/B tests; the default table above is
    # named after its file stem. Each is loaded on first use.
    extra_asg_tables: dict[str, str | Path] = field(default_factory=dict)
    num_speculative_tokens: int = 3  # γ; 0 (or no draft) decodes with the target alone
    device: str = "cpu"  # "cpu" | "cuda" | "cuda:N"
    dtype: str = "auto"  # "auto" (float32 on CPU, bfloat16 on CUDA) | "float32" | "bfloat16" | "float16"
    block_size: int = 16  # tokens per KV block
    kv_budget_tokens: int | None = None  # KV capacity in tokens, per model (default 16384)
    kv_budget_bytes: int | None = None  # or: bytes for target + draft caches together (wins if set)
    max_num_seqs: int = 16  # running sequences per step
    max_num_batched_tokens: int = 2048  # prompt tokens prefilled per step (longer ones: chunked)
    max_waiting: int = 64  # bounded FCFS waiting queue; beyond it requests are refused (EngineOverloaded)
    max_model_len: int | None = None  # prompt + output cap; default min(max_position_embeddings, KV capacity)
    attention_backend: str = "auto"  # "auto" | "sdpa" (gather + SDPA, any device) | "flash_attn" (CUDA)
    seed: int = 0  # seeds the generator shared by requests without their own seed


@dataclass
class SamplingParams:
    """Per-request decoding parameters, applied identically to draft and target distributions."""

    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    repetition_penalty: float = 1.0  # Hugging Face semantics, over prompt + generated tokens; 1 = off
    max_tokens: int = 256  # generated tokens, stop token included
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None  # own generator: output independent of what else shares the batch
    constraint: DecodeConstraint | None = None  # speech-family decode-time logits transform
    acceptance: str | None = None  # per-request rule override (A/B tests); None = the engine's rule
    asg_table: str | None = None  # name of one of the engine's ASG tables for this request; None = default
    # Draft tokens verified per step for this request, 1..the engine's γ (the draft still proposes the
    # engine's γ for the whole batch; this row's verify stops at its own). None = the engine's γ.
    num_speculative_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be > 0")
        if self.num_speculative_tokens is not None and self.num_speculative_tokens < 1:
            raise ValueError("num_speculative_tokens must be >= 1 (or None for the engine's)")
        self.stop_token_ids = list(self.stop_token_ids)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
