"""The engine: models + paged KV + scheduler + speculative step, driven one `step()` at a time.

    engine = Engine(EngineConfig(target="models/demo-en/target", draft="models/demo-en/draft"))
    outs = engine.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=50))

`generate` is the blocking batch API; servers drive `add_request` / `abort` / `step` (see async_engine).
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from pcgtts.engine.acceptance import RuleCache
from pcgtts.engine.attention import make_backend
from pcgtts.engine.batch_invariance import (
    CALIBRATIONS,
    PLAIN,
    ROW_QUANTA,
    InvariancePlan,
    calibrate,
    invariant_anywhere,
    random_rows,
)
from pcgtts.engine.config import (
    CPU_ATTENTION,
    CPU_KV,
    CPU_WEIGHTS,
    DETERMINISTIC_MODES,
    EngineConfig,
    SamplingParams,
    check_prompt,
)
from pcgtts.engine.faults import isolate_faults, snapshot
from pcgtts.engine.metrics import Counters, EngineMetrics
from pcgtts.engine.model.captured import resolve_mode
from pcgtts.engine.model.config import LlamaConfig
from pcgtts.engine.model.feature_head import is_feature_head, load_feature_head
from pcgtts.engine.model.llama import BF16_CALL_ROWS, resolve_cpu_weights
from pcgtts.engine.model.loader import few_op_forms, load_llama, resolve_dtype
from pcgtts.engine.model_runner import ModelRunner, attends_by_rows, kv_store_dtype
from pcgtts.engine.ops import Ops
from pcgtts.engine.scheduler import Scheduler
from pcgtts.engine.sequence import Sequence as Seq
from pcgtts.engine.spec_decode import SpeculativeDecoder
from pcgtts.engine.spec_policy import SpeculationPolicy
from pcgtts.engine.spec_tree import TreeDecoder

DEFAULT_KV_TOKENS = 16384
log = logging.getLogger(__name__)


@dataclass
class RequestOutput:
    """What one step produced for one request."""

    request_id: str
    token_ids: list[int]  # new since the previous output of this request
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "error" | None
    num_drafted: int  # draft tokens proposed for the request in this step
    num_accepted: int  # of which accepted
    error: str | None = None  # what failed, when finish_reason is "error"


@dataclass
class Generation:
    request_id: str
    token_ids: list[int]  # generated tokens only (stop token included when one ended the request)
    finish_reason: str
    num_drafted: int
    num_accepted: int
    num_steps: int


class Engine:
    def __init__(self, config: EngineConfig):
        self.config = config
        if not 0.0 <= config.draft_confidence <= 1.0:
            raise ValueError(f"draft_confidence must lie in [0, 1], not {config.draft_confidence}")
        if config.cpu_attention not in CPU_ATTENTION:
            raise ValueError(f"cpu_attention must be one of {CPU_ATTENTION}, not {config.cpu_attention!r}")
        if config.cpu_weights not in CPU_WEIGHTS:
            raise ValueError(f"cpu_weights must be one of {CPU_WEIGHTS}, not {config.cpu_weights!r}")
        if config.cpu_kv not in CPU_KV:
            raise ValueError(f"cpu_kv must be one of {CPU_KV}, not {config.cpu_kv!r}")
        self.device = torch.device(config.device)
        self.decode_graphs = resolve_mode(config.decode_graphs, self.device)
        self.dtype = resolve_dtype(config.dtype, self.device, compiled=self.decode_graphs == "compile")
        self.target_config = LlamaConfig.from_dir(config.target)
        # the draft: a feature head over the target's hidden state (no KV cache), or a small Llama
        head_draft = bool(config.draft) and is_feature_head(config.draft)
        draft_config = LlamaConfig.from_dir(config.draft) if config.draft and not head_draft else None
        if draft_config is not None and draft_config.vocab_size != self.target_config.vocab_size:
            raise ValueError(f"draft vocabulary {draft_config.vocab_size} != target "
                             f"{self.target_config.vocab_size}")
        gamma = config.num_speculative_tokens if draft_config is not None or head_draft else 0
        self.num_speculative_tokens = gamma  # γ: 0 decodes with the target alone
        if gamma == 0:
            draft_config, head_draft = None, False
        branches = self._tree_branches(config, head_draft, gamma)
        self.decoder_branches = branches
        # the lengths the speculation policy may choose; every size below is the longest's
        self.policy = SpeculationPolicy(gamma, config.speculation, tuple(config.speculation_lengths))
        if branches > 1 and set(self.policy.choices) - {0, gamma}:
            raise ValueError("token trees (draft_branches > 1) run one draft length: speculation_lengths "
                             "must be empty")
        longest = self.policy.max_length
        ahead = longest * branches  # drafts a verify forward scores per row (a tree's every node)

        block_size = config.block_size
        backend = make_backend(config.attention_backend, self.device, self.dtype, block_size)
        compiled = self.decode_graphs != "eager"
        row_attention = config.compiled_cpu_ops and config.cpu_attention == "rows"
        rows = attends_by_rows(row_attention, self.device, backend, self.dtype)
        self.kv_dtype = kv_store_dtype(config.cpu_kv, rows, self.device, self.dtype, compiled)
        num_blocks = self._num_blocks(draft_config)
        capacity = num_blocks * block_size
        self.max_model_len = min(config.max_model_len or self.target_config.max_position_embeddings,
                                 capacity - ahead - 1)
        if self.max_model_len < 2:
            raise ValueError(f"KV budget of {capacity} tokens is too small for γ={longest}")
        positions = self.max_model_len + longest + 1
        graphs = dict(decode_graphs=self.decode_graphs, cache_dir=config.compile_cache_dir,
                      kv_mirror_bytes=config.kv_mirror_bytes, row_attention=row_attention,
                      kv_dtype=self.kv_dtype)
        # decode shapes: the target scores γ+1 tokens per row, or 1 (target-only steps, which the speculation
        # policy may choose); the draft feeds 1, or 2 when it catches up after a fully accepted round
        target_tokens = (1, *(g + 1 for g in self.policy.choices if g))
        self.target = ModelRunner(load_llama(config.target, self.device, self.dtype, positions, compiled),
                                  num_blocks, block_size, backend, decode_tokens=target_tokens,
                                  tree_tokens=ahead + 1 if branches > 1 else 0, **graphs)
        self.draft, self.head = None, None
        if head_draft:
            self.head = load_feature_head(config.draft, self.target.model,
                                          few_op_forms(self.device, self.dtype, compiled))
        if draft_config is not None:
            self.draft = ModelRunner(load_llama(config.draft, self.device, self.dtype, positions, compiled),
                                     num_blocks, block_size, backend, decode_tokens=(1, 2), **graphs)
        self.half_weight_products = 0  # projections multiplying from an fp16 copy of their weights
        self.bf16_weight_products = 0  # projections multiplying from a bf16 copy of their weights (at batch)
        self.int8_weight_products = 0  # projections multiplying from an int8 copy of their weights (at batch)
        self.cpu_weights = resolve_cpu_weights(config.cpu_weights)
        eager_float32 = few_op_forms(self.device, self.dtype, compiled)
        if self.cpu_weights in ("fp16", "bf16", "int8") and eager_float32:
            self.half_weight_products = sum(p.use_half_weights() for p in self._projections())
        if self.cpu_weights == "bf16" and eager_float32:
            # not the LM heads: bf16 rounds each logit to 8 bits (a step of 1/16 at 16), which would move
            # the sampling distribution itself; the heads keep their fp16 copies
            heads = [self.target.model.lm_head] + ([self.draft.model.lm_head] if self.draft else [])
            self.bf16_weight_products = sum(p.use_bf16_weights() for p in self._projections()
                                            if not any(p is h for h in heads))
        if self.cpu_weights == "int8" and eager_float32:
            self.int8_weight_products = sum(p.use_int8_weights() for part in self._parts()
                                            for p in part.int8_projections())
            if not self.int8_weight_products:  # fbgemm does not run here (not x86 with AVX2)
                log.warning("cpu_weights='int8': no int8 products on this machine; fp16 or fp32 ones instead")
        self.invariance = self._invariance_plan()  # PLAIN when forwards are never made batch-invariant
        # captured graphs are built now, before the engine reports ready, not on the first request
        self.capture_seconds = self.target.warm_up("target") + (self.draft.warm_up("draft") if self.draft
                                                                else 0.0)

        # the forms of the per-step operations, chosen once for this engine (engine/ops)
        self.ops = Ops.choose(self.device, self.target_config.vocab_size, config.compiled_cpu_ops)
        if self.ops.compiled and few_op_forms(self.device, self.dtype, compiled):
            for norm in self._norms():  # each forward's norms as compiled loops too (engine/ops/rms_norm.py)
                norm.compiled = True
        self.rules = RuleCache(config.acceptance, config.acceptance_params, self.asg_table_paths, self.device,
                               self.ops)
        for runner in (self.target, self.draft):
            if runner is not None:
                runner.blocks.prefix_caching = config.enable_prefix_caching
        if gamma:
            self.rules.get()  # fail at start-up, not on the first request
        self.shared_generator = torch.Generator(self.device).manual_seed(config.seed)
        decoder_args = (self.target, self.draft, longest, self.shared_generator, self.head, self.ops,
                        self.invariance, "off" if not self.invariance.active else config.deterministic)
        self.decoder = (TreeDecoder(*decoder_args, branches=branches) if branches > 1 else
                        SpeculativeDecoder(*decoder_args, draft_confidence=config.draft_confidence))
        self.scheduler = Scheduler(self.target.blocks, self.draft.blocks if self.draft else None, ahead,
                                   config.max_num_seqs, config.max_num_batched_tokens, config.max_waiting,
                                   ahead_s=config.deadline_ahead_s, max_defer=config.max_defer_steps)
        self.requests: dict[str, Seq] = {}
        self.counters = Counters(num_speculative_tokens=longest)
        self._arrivals = itertools.count()

    # ---- set-up helpers ---------------------------------------------------------------------------------
    def _num_blocks(self, draft_config: LlamaConfig | None) -> int:
        cfg, bs = self.config, self.config.block_size
        if cfg.kv_budget_bytes:
            per_token = self.target_config.kv_bytes_per_token(self.kv_dtype)
            if draft_config is not None:
                per_token += draft_config.kv_bytes_per_token(self.kv_dtype)
            return max(1, cfg.kv_budget_bytes // (per_token * bs))
        return max(1, -(-(cfg.kv_budget_tokens or DEFAULT_KV_TOKENS) // bs))

    def _invariance_plan(self) -> InvariancePlan:
        """The cheapest padding that keeps every row batch-invariant with this machine's kernels
        (batch_invariance.calibrate over every distinct matrix product of the models), or PLAIN when the
        config wants none or none works here (then "seeded" warns, "always" raises)."""
        mode = self.config.deterministic
        if mode not in DETERMINISTIC_MODES:
            raise ValueError(f"deterministic must be one of {DETERMINISTIC_MODES}, not {mode!r}")
        if mode == "off":
            return PLAIN
        plan, why = None, "captured decode graphs are not checked for batch invariance"
        if self.decode_graphs == "eager":
            checks, tcfg = self._product_checks(), self.target_config
            # torch's attention kernel is measured only where a forward under the plan would run it
            runners = [self.target] + ([self.draft] if self.draft else [])
            attention = None if all(r.row_attention for r in runners) else \
                (tcfg.num_heads, tcfg.num_kv_heads, tcfg.head_dim, self.target.mask_dtype)
            plan = None
            if self._bf16_invariant_products():
                # seeded steps at batch multiply as fast as unseeded ones where oneDNN keeps rows invariant
                plan = self._calibrated(self._product_checks(bf16=True), attention)
                plan = replace(plan, bf16_products=True) if plan is not None else None
            if plan is None:
                plan = self._calibrated(checks, attention)
            if plan is None and self.half_weight_products:
                # fbgemm's fp16 kernels keep rows invariant on the machines measured (multiples of 3 rows);
                # where they do not, every forward keeps the fp32 products (the copies are dropped)
                log.warning("fp16-weight products are not batch-invariant here: fp32 products instead")
                for p in self._projections():
                    p.half = None
                self.half_weight_products = 0
                checks = self._product_checks()
                plan = self._calibrated(checks, attention)
            why = (f"no padding of rows to a multiple of {ROW_QUANTA} makes its matrix products and "
                   f"attention batch-invariant")
        if plan is None:
            message = f"batch-invariant forwards are not available on {self.device} ({self.dtype}, " \
                      f"decode_graphs={self.decode_graphs!r}): {why}"
            if mode == "always":
                raise ValueError(f"deterministic='always': {message}")
            log.warning("%s; a seed fixes a request's tokens only among the same batch mates", message)
            return PLAIN
        attends = "each row's own attention" if attention is None else \
            f"attention queries of {plan.query_quantum}, key blocks of {plan.min_keys}-{plan.key_tile} keys"
        bf16 = sum(p.bf16_invariant for p in self._projections()) if plan.bf16_products else 0
        log.info("batch-invariant forwards (%s): GEMM rows padded to a multiple of %d, %s; %d projections "
                 "through their bf16 copies", mode, plan.row_quantum, attends, bf16)
        return plan

    def _calibrated(self, checks: list[tuple[tuple, tuple]], attention: tuple | None
                    ) -> InvariancePlan | None:
        """batch_invariance.calibrate over these products (and torch's attention kernel of this shape, unless
        None), measured once per process."""
        key = (tuple(shape for shape, _ in checks), attention, self.device, self.dtype,
               torch.get_num_threads())
        if key not in CALIBRATIONS:
            CALIBRATIONS[key] = calibrate([check for _, check in checks], attention, self.device, self.dtype)
        return CALIBRATIONS[key]

    @staticmethod
    def _tree_branches(config: EngineConfig, head_draft: bool, gamma: int) -> int:
        """k of EngineConfig.draft_branches, checked against what token trees run on (1 without a draft)."""
        k = config.draft_branches
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"draft_branches must be a positive integer, not {k!r}")
        if k == 1 or not gamma:
            return 1
        if not head_draft:
            raise ValueError("token trees (draft_branches > 1) need a feature-head draft")
        if gamma < 2:
            raise ValueError("token trees (draft_branches > 1) need γ ≥ 2")
        if config.draft_confidence:
            raise ValueError("token trees (draft_branches > 1) draft every branch to γ: draft_confidence "
                             "must be 0")
        if config.attention_backend == "flash_attn":
            raise ValueError("token trees (draft_branches > 1) need the sdpa attention backend")
        return k

    def _parts(self) -> list:
        """The target, the Llama draft and the feature head, those this engine has."""
        return [part for part in (self.target.model, self.draft.model if self.draft else None, self.head)
                if part is not None]

    def _projections(self) -> list:
        """Every matrix product of the target, the Llama draft and the feature head."""
        return [p for part in self._parts() for p in part.projections()]

    def _norms(self) -> list:
        """Every RMSNorm of the target, the Llama draft and the feature head."""
        return [n for part in self._parts() for n in part.norms()]

    def _bf16_invariant_products(self) -> int:
        """Mark the projections whose bf16 product computes each row alike in a call of any row count up to
        BF16_CALL_ROWS, at any place in it (Projection.bf16_invariant; measured once per shape and process);
        how many are."""
        for p in self._projections():
            if p.bf16 is not None:
                key = ("bf16 rows", tuple(p.weight.shape), torch.get_num_threads())
                if key not in CALIBRATIONS:
                    x = random_rows(BF16_CALL_ROWS, p.in_features, self.device, self.dtype)
                    CALIBRATIONS[key] = invariant_anywhere(p.bf16_product, x)
                p.bf16_invariant = bool(CALIBRATIONS[key])
        return sum(p.bf16_invariant for p in self._projections())

    def _product_checks(self, bf16: bool = False) -> list[tuple[tuple, tuple]]:
        """(kind, (product, in_features, rows to check)) for each distinct kind of matrix product of the
        models (weight shape, layout, rows): the LM heads at decode sizes only, the others at prefill
        sizes too. bf16: projections with a bf16 copy checked through it (a plan with bf16 products)."""
        decode_rows = self.config.max_num_seqs * (self.policy.max_length * self.decoder_branches + 1)
        heads = [self.target.model.lm_head] + ([self.draft.model.lm_head] if self.draft else [])
        kinds = {}
        for p in self._projections():
            rows = decode_rows if any(p is h for h in heads) else max(decode_rows, 1000)
            through_bf16 = bf16 and p.bf16_invariant  # marked only where a copy exists
            kinds.setdefault((tuple(p.weight.shape), p.input_major, p.half is not None, through_bf16, rows),
                             p)
        return [(kind, (p.bf16_product if kind[3] else p.weights_product, p.in_features, kind[-1]))
                for kind, p in kinds.items()]

    @property
    def asg_table_paths(self) -> dict[str, Path]:
        """ASG tables by name: the default (its file stem) first, then the extra ones."""
        default = self.config.asg_table
        paths = {Path(default).stem: Path(default)} if default else {}
        return paths | {name: Path(path) for name, path in self.config.extra_asg_tables.items()}

    @property
    def vocab_size(self) -> int:
        return self.target_config.vocab_size

    # ---- requests ---------------------------------------------------------------------------------------
    def add_request(self, prompt_ids: list[int], params: SamplingParams,
                    request_id: str | None = None, continuing: bool = False) -> str:
        """Queue a request; raises EngineOverloaded when the waiting queue is full, unless `continuing`
        (the next part of a request admitted earlier: never refused, see Scheduler.add)."""
        request_id = request_id or uuid.uuid4().hex
        if request_id in self.requests:
            raise ValueError(f"duplicate request id {request_id!r}")
        prompt_ids = self.validate(prompt_ids, params)
        # the rule that verifies this request's drafts, built now: a misconfigured one fails this request only
        rule = self.rules.get(params.acceptance, params.asg_table) if self.num_speculative_tokens else None
        generator = None
        if params.reproducible:  # greedy still draws: PCG draws a draft token's group label
            seed = params.seed if params.seed is not None else self.config.seed
            generator = torch.Generator(self.device).manual_seed(seed)
        seq = Seq(request_id=request_id, prompt_len=len(prompt_ids), token_ids=prompt_ids,
                       params=params, generator=generator, arrival=next(self._arrivals), rule=rule)
        self.scheduler.add(seq, continuing)
        self.requests[request_id] = seq
        return request_id

    def validate(self, prompt_ids: list[int], params: SamplingParams) -> list[int]:
        """Check a request without queueing it (safe from any thread); returns the prompt as ints."""
        params.check()  # again here: fields may have been changed since construction
        prompt_ids = check_prompt(prompt_ids, self.vocab_size, self.max_model_len)
        if params.asg_table is not None:
            self.rules.check_table(params.asg_table)
        if self.num_speculative_tokens:
            self.rules.check(params.acceptance, params.asg_table)
        own = params.num_speculative_tokens
        if own is not None and own > self.num_speculative_tokens:
            raise ValueError(f"num_speculative_tokens {params.num_speculative_tokens} exceeds this engine's "
                             f"γ = {self.num_speculative_tokens}")
        return prompt_ids

    def abort(self, request_id: str) -> bool:
        """Stop a request now and free its KV blocks; False if it is unknown or already finished."""
        seq = self.requests.get(request_id)
        if seq is None or seq.is_finished:
            return False
        self._finish(seq, "abort")
        return True

    def set_deadline(self, request_id: str, deadline: float | None) -> None:
        """Tell the scheduler when this request's listener runs out of audio (time.perf_counter() time;
        None = no audio yet). Unknown or finished requests are ignored."""
        seq = self.requests.get(request_id)
        if seq is not None:
            seq.deadline = deadline

    def pin_prefix(self, token_ids: list[int], lru: bool = False) -> None:
        """Keep this prompt prefix's full blocks (e.g. a preset voice's reference) cached for good once a
        request has computed them (at most a quarter of each pool is pinned). lru (e.g. uploaded voices):
        pinned until the budget is full and a newer lru pin needs room; pinning again refreshes it."""
        for runner in (self.target, self.draft):
            if runner is not None:
                runner.blocks.pin([int(t) for t in token_ids], lru)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work

    def _finish(self, seq: Seq, reason: str) -> None:
        self.scheduler.remove(seq)
        seq.finish_reason = reason
        self.counters.finished[reason] += 1
        self.requests.pop(seq.request_id, None)

    # ---- the loop ---------------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        """Schedule, prefill, take one decoding step for every ready sequence; report what changed.

        A fault that one sequence causes (its constraint raises, its numbers break the sampler) finishes
        that sequence with finish_reason "error" and the step goes on for the others; a fault that is
        nobody's (device lost, out of memory) raises EngineFault."""
        plan = self.scheduler.schedule()
        for seq, _ in plan.prefill:
            if not seq.ever_admitted:
                seq.ever_admitted = True
                self.counters.prompt_tokens += seq.prompt_len
        failed: list[tuple[Seq, BaseException]] = []
        isolate_faults(plan.prefill, self.decoder.prefill, snapshot, failed)
        broken = {id(seq) for seq, _ in failed}
        for seq, _ in plan.prefill:  # its computed prompt blocks are now shareable
            if id(seq) not in broken:
                seq.target.cache_prefix(self.target.blocks, seq.token_ids, seq.prompt_len)
                if self.draft is not None:
                    seq.draft.cache_prefix(self.draft.blocks, seq.token_ids, seq.prompt_len)
        decode = [s for s in plan.decode if id(s) not in broken]
        for seq in decode:
            if not seq.ever_admitted:  # one-token prompts skip prefill
                seq.ever_admitted = True
                self.counters.prompt_tokens += seq.prompt_len
        outputs = [self._fail(seq, exc) for seq, exc in failed]
        if not decode:
            return outputs
        gamma = self.policy.draft_length(len(decode))  # one decision per engine step
        rows = isolate_faults(decode, lambda seqs: self._decode_rows(seqs, gamma), snapshot, failed)
        outputs += [self._fail(seq, exc) for seq, exc in failed[len(outputs):]]
        self.counters.record_step(len(rows), [r[2] for r in rows], [r[3] for r in rows])
        for seq, tokens, drafted, k in rows:
            seq.num_steps += 1
            seq.num_drafted += drafted
            seq.num_accepted += k
            reason = self._append(seq, tokens)
            if reason is not None:
                self._finish(seq, reason)
            outputs.append(self._output(seq, drafted, k))
        return outputs

    def _decode_rows(self, seqs: list[Seq], gamma: int) -> list[tuple[Seq, list[int], int, int]]:
        """One decoding step for `seqs` at the policy's draft length: (sequence, emitted tokens, drafted,
        accepted) per row. Timed for the speculation policy."""
        rows = []
        clock = self._step_clock()
        for group, group_gamma in self._decode_groups(seqs, gamma):
            started = clock()
            result = self.decoder.step(group, group_gamma)
            emitted = sum(len(t) for t in result.tokens)
            self.policy.record(len(group), group_gamma, clock() - started, emitted)
            rows += zip(group, result.tokens, result.num_drafted, result.num_accepted, strict=True)
        return rows

    def _step_clock(self):
        """What the speculation policy times steps with: on a CPU running torch on this thread alone, the
        thread's own CPU time (other processes on a shared machine do not inflate it); else wall time."""
        if self.device.type == "cpu" and torch.get_num_threads() == 1:
            return time.thread_time
        return time.perf_counter

    def _decode_groups(self, seqs: list[Seq], gamma: int) -> list[tuple[list[Seq], int]]:
        """(sequences, draft length) forwards of this step. The policy decides for the batch; seeded requests
        speculate at the configured γ on every step whatever it decides, so a seed still fixes a request's
        tokens (run to run, whatever shares the batch; so do greedy ones, SamplingParams.reproducible);
        when the policy says otherwise they take a forward of their own."""
        fixed = self.num_speculative_tokens
        reproducible = [s for s in seqs if s.params.reproducible]
        if gamma == fixed or not reproducible:
            return [(seqs, gamma)]
        plain = [s for s in seqs if not s.params.reproducible]
        return [(reproducible, fixed)] + ([(plain, gamma)] if plain else [])

    def _fail(self, seq: Seq, exc: BaseException) -> RequestOutput:
        log.warning("request %s failed alone in the engine step: %r", seq.request_id, exc)
        self._finish(seq, "error")
        out = self._output(seq, 0, 0)
        out.error = f"{type(exc).__name__}: {exc}"
        return out

    def _append(self, seq: Seq, tokens: list[int]) -> str | None:
        """Append emitted tokens up to a stop token or a length limit; returns the finish reason."""
        params = seq.params
        limit = min(params.max_tokens, self.max_model_len - seq.prompt_len)
        reason = None
        start = seq.length
        for tok in tokens:
            seq.token_ids.append(tok)
            if tok in params.stop_token_ids:
                reason = "stop"
                break
            if seq.num_output >= limit:
                reason = "length"
                break
        if seq.presence is not None:
            seq.presence[torch.tensor(seq.token_ids[start:], device=self.device)] = True
        self.counters.generation_tokens += seq.length - start
        return reason

    def _output(self, seq: Seq, drafted: int, accepted: int) -> RequestOutput:
        new = seq.token_ids[seq.prompt_len + seq.num_streamed:]
        seq.num_streamed += len(new)
        return RequestOutput(request_id=seq.request_id, token_ids=new, finished=seq.is_finished,
                             finish_reason=seq.finish_reason, num_drafted=drafted, num_accepted=accepted)

    # ---- blocking batch API -----------------------------------------------------------------------------
    def generate(self, prompts: Sequence[list[int]],
                 params: SamplingParams | Sequence[SamplingParams]) -> list[Generation]:
        """Run all prompts to completion (continuous batching) and return them in order."""
        per_prompt = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        pending = deque(zip(prompts, per_prompt, strict=True))
        seqs: list[Seq] = []
        while pending or self.has_unfinished():
            while pending and len(self.scheduler.waiting) < self.config.max_waiting:
                prompt, p = pending.popleft()
                rid = self.add_request(prompt, p)
                seqs.append(self.requests[rid])
            self.step()
        return [Generation(request_id=s.request_id, token_ids=s.output_ids, finish_reason=s.finish_reason,
                           num_drafted=s.num_drafted, num_accepted=s.num_accepted, num_steps=s.num_steps)
                for s in seqs]

    # ---- metrics ----------------------------------------------------------------------------------------
    def metrics(self) -> EngineMetrics:
        c, blocks = self.counters, self.target.blocks
        return EngineMetrics(
            num_running=len(self.scheduler.running), num_waiting=len(self.scheduler.waiting),
            kv_usage=blocks.num_held / blocks.num_blocks, kv_blocks_total=blocks.num_blocks,
            kv_blocks_used=blocks.num_held, kv_blocks_pinned=len(blocks.cache.pinned_blocks),
            prompt_tokens=c.prompt_tokens,
            generation_tokens=c.generation_tokens, spec_num_drafts=c.spec_num_drafts,
            spec_drafted_tokens=c.spec_drafted_tokens, spec_accepted_tokens=c.spec_accepted_tokens,
            spec_accepted_per_position=list(c.spec_accepted_per_position),
            spec_drafted_per_position=list(c.spec_drafted_per_position),
            preemptions=self.scheduler.num_preemptions, prefix_cache_queries=self.scheduler.prefix_queries,
            prefix_cache_hits=self.scheduler.prefix_hits, speculative_steps=self.policy.speculative_steps,
            target_only_steps=self.policy.target_only_steps,
            steps_by_draft_length=dict(sorted(self.policy.steps_by_length.items())), steps=c.steps,
            batch_tokens=c.batch_tokens,
            finished=dict(c.finished))

    def kv_blocks_in_use(self) -> tuple[int, int]:
        """(target, draft) blocks currently held by sequences (not counting those only pins keep)."""
        return self.target.blocks.num_held, self.draft.blocks.num_held if self.draft else 0
