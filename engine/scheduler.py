"""Continuous batching: which sequences run this step, which prefill, which wait.

Every step the running sequences first reserve KV room for one more speculative step (γ+1 positions in
the target, γ in the draft); when the pool runs dry the newest running sequence is preempted (its blocks
freed, its tokens kept) and goes back to the front of the queue to be recomputed later. Then waiting
requests are admitted first-come-first-served (no overtaking) while there is room, a free sequence slot
and prefill budget left. Prompts longer than the per-step budget are prefilled in chunks over several
steps. A sequence decodes in the same step its prefill completes.

Audio deadlines: a caller may tell the engine when each request's listener runs out of buffered audio
(`Sequence.deadline`). When some sequence in the step is urgent (no audio yet, or less than `ahead_s`
buffered), ready sequences with more than `ahead_s` of audio buffered sit the step out, so the step is
smaller and faster for those who need it: a new request's first audio is not held up behind long streams.
Nobody starves: a sequence sits out at most `max_defer` steps in a row, and nothing waits when nobody
is urgent.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from pcgtts.engine.block_manager import BlockAllocator, OutOfBlocks
from pcgtts.engine.errors import EngineOverloaded
from pcgtts.engine.sequence import Sequence, Status


@dataclass
class StepPlan:
    prefill: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, tokens to prefill now)
    decode: list[Sequence] = field(default_factory=list)  # sequences taking a decode/speculative step
    preempted: list[Sequence] = field(default_factory=list)


class Scheduler:
    def __init__(self, target_blocks: BlockAllocator, draft_blocks: BlockAllocator | None,
                 num_speculative_tokens: int, max_num_seqs: int, max_num_batched_tokens: int,
                 max_waiting: int, ahead_s: float = 2.0, max_defer: int = 4,
                 clock: Callable[[], float] = time.perf_counter):
        self.target_blocks = target_blocks
        self.draft_blocks = draft_blocks
        self.num_speculative_tokens = num_speculative_tokens
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_waiting = max_waiting
        self.ahead_s = ahead_s  # buffered audio beyond which a stream may sit out a step
        self.max_defer = max_defer  # steps in a row a ready sequence may sit out (0 = never)
        self.clock = clock  # the time base of Sequence.deadline
        self.num_deferred = 0  # (sequence, step) pairs that sat out
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.prefix_queries = 0  # prompt tokens of admitted sequences (vLLM: prefix_cache_queries)
        self.prefix_hits = 0  # of which their target KV came from the prefix cache (prefix_cache_hits)

    # ---- queue ----------------------------------------------------------------------------------------
    def add(self, seq: Sequence, continuing: bool = False) -> None:
        """Queue a new request (EngineOverloaded when the queue is full), or, `continuing`, the next part of
        an already admitted one (e.g. a later sentence): never refused, and queued ahead of new requests
        so that a stream in progress is not starved by newcomers."""
        seq.status = Status.WAITING
        if continuing:
            self.waiting.appendleft(seq)
            return
        if len(self.waiting) >= self.max_waiting:
            raise EngineOverloaded(f"waiting queue full ({self.max_waiting} requests)")
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out of the queues (finish or abort) and free its KV blocks."""
        if seq.status is Status.WAITING:
            self.waiting.remove(seq)
        elif seq.status is Status.RUNNING:
            self.running.remove(seq)
            self._release(seq)
        seq.status = Status.FINISHED

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- KV room ---------------------------------------------------------------------------------------
    def room_needed(self, seq: Sequence) -> tuple[int, int]:
        """Tokens of KV each model must hold for `seq`'s next step: (target, draft)."""
        gamma = self.num_speculative_tokens
        return seq.length + gamma, seq.length + gamma - 1

    def _reserve(self, seq: Sequence) -> bool:
        target_tokens, draft_tokens = self.room_needed(seq)
        try:
            seq.target.ensure(self.target_blocks, target_tokens)
            if self.draft_blocks is not None:
                seq.draft.ensure(self.draft_blocks, draft_tokens)
        except OutOfBlocks:
            return False
        return True

    def _fits_with_headroom(self, seq: Sequence) -> bool:
        """Admit only if every running sequence could still grow by one block afterwards."""
        target_tokens, draft_tokens = self.room_needed(seq)
        headroom = len(self.running)
        pools = [(self.target_blocks, seq.target, target_tokens)]
        if self.draft_blocks is not None:
            pools.append((self.draft_blocks, seq.draft, draft_tokens))
        for pool, blocks, tokens in pools:
            need = pool.blocks_for(tokens) - len(blocks.blocks)
            if pool.num_free - need < headroom:
                return False
        return True

    def _release(self, seq: Sequence) -> None:
        seq.target.release(self.target_blocks)
        if self.draft_blocks is not None:
            seq.draft.release(self.draft_blocks)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    # ---- the step plan ---------------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        plan = StepPlan()
        i = 0
        while i < len(self.running):
            seq = self.running[i]
            if self._reserve(seq):
                i += 1
                continue
            victim = self.running[-1]
            self._preempt(victim)
            plan.preempted.append(victim)
        budget = self.max_num_batched_tokens
        chunks: dict[int, int] = {}
        for seq in self.running:
            todo = seq.length - 1 - seq.target.num_computed
            if todo > 0 and budget > 0:
                chunks[id(seq)] = min(todo, budget)
                budget -= chunks[id(seq)]
                plan.prefill.append((seq, chunks[id(seq)]))
        if not plan.preempted:
            self._admit(plan, budget, chunks)
        ready = [s for s in self.running if s.target.num_computed + chunks.get(id(s), 0) == s.length - 1]
        plan.decode = self._by_deadline(ready, urgent_prefill=bool(plan.prefill))
        return plan

    def _by_deadline(self, ready: list[Sequence], urgent_prefill: bool) -> list[Sequence]:
        """The ready sequences that take this step: far-ahead ones sit out while someone is urgent."""
        if self.max_defer <= 0 or not ready:
            return ready
        now = self.clock()
        ahead = [s.deadline is not None and s.deadline - now > self.ahead_s for s in ready]
        if not urgent_prefill and all(ahead):  # nobody is urgent: nobody waits
            return ready
        far = [a and s.deferred < self.max_defer for s, a in zip(ready, ahead, strict=True)]
        decode = []
        for seq, wait in zip(ready, far, strict=True):
            if wait:
                seq.deferred += 1
                self.num_deferred += 1
            else:
                seq.deferred = 0
                decode.append(seq)
        return decode

    def _share_prefix(self, seq: Sequence) -> None:
        """Start a sequence holding no KV from the cached blocks of its prompt's prefix (both models; the
        draft never ahead of the target). Only positions before the last prompt token can be shared: the
        target computes that one in the sequence's first decoding step."""
        limit = seq.prompt_len - 1
        reused = seq.target.share_prefix(self.target_blocks, seq.token_ids, limit)
        if self.draft_blocks is not None:
            seq.draft.share_prefix(self.draft_blocks, seq.token_ids, reused)

    def _admit(self, plan: StepPlan, budget: int, chunks: dict[int, int]) -> None:
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if budget <= 0 and seq.length > 1:
                break
            self._share_prefix(seq)
            todo = seq.length - 1 - seq.target.num_computed
            if todo > 0 and budget <= 0:
                self._release(seq)
                break
            if not self._fits_with_headroom(seq) or not self._reserve(seq):
                self._release(seq)
                break
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            self.prefix_queries += seq.prompt_len
            self.prefix_hits += seq.target.num_computed
            if todo > 0:
                chunks[id(seq)] = min(todo, budget)
                budget -= chunks[id(seq)]
                plan.prefill.append((seq, chunks[id(seq)]))
