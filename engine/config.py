"""Engine and per-request sampling configuration (public contract, exported by `engine`)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pcgtts.engine.speech.base import DecodeConstraint


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
    asg_table: str | Path | None = None  # for pcg, pcg-block, lantern (ASGTable.load)
    # More tables (e.g. other θ) that a request may pick by name for A/B tests; the default table above is
    # named after its file stem. Each is loaded on first use.
    extra_asg_tables: dict[str, str | Path] = field(default_factory=dict)
    num_speculative_tokens: int = 3  # γ; 0 (or no draft) decodes with the target alone
    # θ: a row's drafts after the first are verified only while the draft's top probability at each of their
    # positions is at least this (engine/draft_length.py), so γ becomes the most a row drafts; 0: every row
    # drafts γ.
    draft_confidence: float = 0.0
    # k: a token tree of k branches of γ drafts each (k candidates for the first draft position, drawn
    # without replacement, each followed by its own chain), verified in one forward by recursive rejection
    # sampling over the candidates (engine/acceptance/tree.py: token level for exact, group level for pcg);
    # feature-head drafts on the sdpa backend only. 1: one chain of γ drafts.
    draft_branches: int = 1
    # "always": every step speculates (γ drafts + verify). "auto": per step, speculate or decode with the
    # target alone, whichever measured faster at this batch size (engine.spec_policy); the TTS service's
    # default. Seeded outputs are reproducible only under "always" (see spec_policy).
    speculation: str = "always"
    # More draft lengths "auto" may choose per batch-size class besides num_speculative_tokens, e.g. (5,):
    # the engine is sized for the longest (KV look-ahead, buffers, captured graphs), while seeded and greedy
    # requests and "always" keep num_speculative_tokens on every step. () : that γ only.
    speculation_lengths: tuple[int, ...] = ()
    device: str = "cpu"  # "cpu" | "cuda" | "cuda:N"
    # "auto": bfloat16 on CUDA, and on CPUs with native bf16 math (AVX512-BF16/AMX) when decode graphs are
    # compiled (eager bf16 is no faster there); float32 otherwise | "float32" | "bfloat16" | "float16"
    dtype: str = "auto"
    block_size: int = 16  # tokens per KV block
    kv_budget_tokens: int | None = None  # KV capacity in tokens, per model (default 16384)
    kv_budget_bytes: int | None = None  # or: bytes for target + draft caches together (wins if set)
    max_num_seqs: int = 16  # running sequences per step
    max_num_batched_tokens: int = 2048  # prompt tokens prefilled per step (longer ones: chunked)
    max_waiting: int = 64  # bounded FCFS waiting queue; beyond it requests are refused (EngineOverloaded)
    max_model_len: int | None = None  # prompt + output cap; default min(max_position_embeddings, KV capacity)
    # Share the K/V of full blocks of prompt tokens between requests with the same prefix (a voice's
    # reference codes), in the target's and the draft's caches; LRU-evicted under the KV budget.
    enable_prefix_caching: bool = True
    # Audio-deadline scheduling (requests whose caller reports when the listener runs dry, see
    # Engine.set_deadline): while someone is urgent, a stream with more than this much audio buffered sits
    # out a step, at most max_defer_steps steps in a row (0 = never).
    deadline_ahead_s: float = 2.0
    max_defer_steps: int = 4
    attention_backend: str = "auto"  # "auto" | "sdpa" (gather + SDPA, any device) | "flash_attn" (CUDA)
    # Decode/verify forwards replayed from captured graphs (engine/model/captured.py): "eager" (none),
    # "compile" (torch.compile/inductor, CPU: minutes of compiling at start-up, cached on disk),
    # "cuda_graphs" (CUDA), "auto" (cuda_graphs on CUDA, eager on CPU). Prefill always runs eagerly.
    decode_graphs: str = "eager"
    compile_cache_dir: str | Path | None = None  # inductor's cache; default $XDG_CACHE_HOME/pcgtts/inductor
    # Eager CPU decoding keeps each running row's K/V contiguous too (engine/kv_mirror.py), so attention
    # reads it in place instead of gathering blocks every forward; bytes per model at most (0 = off).
    kv_mirror_bytes: int = 512 << 20
    # The per-step work between forwards (the demo family's constraint, softmax-and-draw of each draft token,
    # exact's and PCG's verify) as compiled loops (numba, engine/ops) where they apply: on the CPU, for
    # vocabularies up to engine.ops.COMPILED_MAX_V. False: the torch ops everywhere (what CUDA runs).
    compiled_cpu_ops: bool = True
    # Attention of eager CPU float32 forwards: "rows" (each row over its own keys, read in place:
    # engine/ops/row_attention.py; with the compiled ops) or "sdpa" (torch's kernel over a padded context
    # with a mask). Elsewhere (CUDA, other dtypes, captured graphs) the attention backend's own.
    cpu_attention: str = "rows"
    # Weights of eager CPU float32 projections: "fp16" (products of two rows or more multiply from an fp16
    # copy where the checkpoint's values are exactly fp16, as the shipped bundle's are: the same weights at
    # half the bytes, engine/model/llama.py Projection), "fp32" (MKL's products over the float32 weights
    # only) or "bf16" (fp16's, and products but the LM heads' of 16 rows or more in steps outside a plan
    # multiply bf16 inputs by a bf16 copy of the weights through oneDNN, AMX tiles where the CPU has them:
    # rounded weights and inputs, a quality-measured trade, bench/results/bf16-weights/; under a plan, at
    # every row count, the projections whose bf16 rows oneDNN keeps alike in any call of up to 128 rows,
    # measured at start-up, bench/results/bf16-seeded/; where oneDNN has no native bf16 it is fp16) or
    # "int8" (fp16's, and the products over normed inputs or attention (qkv, o, gate_up: not down, not the
    # LM heads, LlamaModel.int8_projections) of 8 rows or more in steps outside a plan through
    # fbgemm's dynamic int8 GEMM: weights per channel and each call's input rounded to int8, a
    # quality-measured trade, bench/results/int8-weights/; where fbgemm does not run it is fp16).
    # "auto": bf16 where the CPU has AMX tiles (where it was measured), else fp16. Other checkpoints,
    # devices and dtypes keep their own.
    cpu_weights: str = "auto"
    # K/V store of eager CPU float32 forwards attending by the rows' own attention (cpu_attention "rows"):
    # "fp16" (K and V rounded to fp16 as they are written, the KV cache and mirror at half the bytes; the
    # row-attention kernel widens them as it reads, and attention is bound by reading them) or "fp32".
    # Other devices, dtypes, attentions and captured graphs keep the model's dtype.
    cpu_kv: str = "fp16"
    seed: int = 0  # seeds the generator shared by sampled requests without a seed, and each greedy one's
    # Batch-invariant forwards (engine/batch_invariance.py): every row's arithmetic the same bits whatever
    # shares its forward, so a seeded request gives the same tokens alone or beside any others. "seeded":
    # every prefill, and every decoding step that holds a seeded or greedy request
    # (SamplingParams.reproducible; the padding they need costs those steps time, measured in
    # bench/results/determinism/); "always": every forward; "off": none (a seed then fixes the tokens
    # only among the same batch mates). The padding is measured on this machine at start-up; where none
    # works (captured decode graphs, some devices) "seeded" falls back to off with a warning and "always"
    # refuses to start.
    deterministic: str = "seeded"


DETERMINISTIC_MODES = ("seeded", "always", "off")
CPU_ATTENTION = ("rows", "sdpa")
CPU_WEIGHTS = ("auto", "fp16", "fp32", "bf16", "int8")
CPU_KV = ("fp16", "fp32")


def check_prompt(prompt_ids, vocab_size: int, max_model_len: int) -> list[int]:
    """A request's prompt as ints, or ValueError (empty, ids outside the vocabulary) / RequestTooLong (no
    room left for generating): the checks every engine makes before queueing a request."""
    from pcgtts.engine.errors import RequestTooLong

    prompt_ids = [int(t) for t in prompt_ids]
    if not prompt_ids:
        raise ValueError("empty prompt")
    if min(prompt_ids) < 0 or max(prompt_ids) >= vocab_size:
        raise ValueError(f"prompt token ids must lie in [0, {vocab_size})")
    if len(prompt_ids) >= max_model_len:
        raise RequestTooLong(f"prompt of {len(prompt_ids)} tokens; the engine holds at most "
                             f"{max_model_len} tokens per sequence")
    return prompt_ids


# Inclusive ranges the engine accepts per request; values outside fail that request with ValueError. They are
# wide (the API's own ranges are narrower) and exist so that no value can break the batched math: finite,
# fits int64, stays nonzero in float32.
MIN_TEMPERATURE = 1e-3  # between 0 (greedy) and this, logits / T overflows float32
SAMPLING_BOUNDS: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 100.0),
    "top_k": (0, 2**62),  # 0 = off; k >= vocabulary size is off too
    "top_p": (1e-6, 1.0),
    "repetition_penalty": (1e-3, 1e3),
    "max_tokens": (1, 2**31 - 1),
    "seed": (0, 2**64 - 1 - 100_000),  # sentences of one input add their index
    "num_speculative_tokens": (1, 64),
}
_INTEGER_FIELDS = ("top_k", "max_tokens", "seed", "num_speculative_tokens")
_EXTRA_RULE = {"temperature": " (0 = greedy)", "top_k": " (0 = off)"}


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
        self.stop_token_ids = list(self.stop_token_ids)
        self.check()

    def check(self) -> None:
        """Raise ValueError unless every field lies in its range (SAMPLING_BOUNDS). The engine checks again
        when a request enters it: a value that slipped past a caller must fail that request alone, never
        the batch step it would have joined (e.g. a top_k that overflows int64, a penalty that is 0.0
        in float32)."""
        for name, (lo, hi) in SAMPLING_BOUNDS.items():
            value = getattr(self, name)
            if value is None and name in ("seed", "num_speculative_tokens"):
                continue
            integral = name in _INTEGER_FIELDS
            kind = numbers.Integral if integral else numbers.Real
            if isinstance(value, bool) or not isinstance(value, kind) or \
                    not (integral or math.isfinite(value)) or not lo <= value <= hi:
                what = "an integer" if integral else "a number"
                raise ValueError(f"{name} must be {what} in [{lo}, {hi}]{_EXTRA_RULE.get(name, '')}; "
                                 f"got {value!r}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}; "
                             f"got {self.temperature!r}")
        if any(not isinstance(t, numbers.Integral) or t < 0 for t in self.stop_token_ids):
            raise ValueError("stop_token_ids must be non-negative integers")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def reproducible(self) -> bool:
        """The tokens are a function of the request alone: seeded, or greedy. Such a request has a generator
        of its own (a greedy one seeded with EngineConfig.seed: PCG still draws a draft token's group label
        where groups overlap), speculates on every step and takes batch-invariant forwards (EngineConfig.
        deterministic "seeded"), so neither what shares its batch nor the speculation policy moves a token."""
        return self.seed is not None or self.greedy
