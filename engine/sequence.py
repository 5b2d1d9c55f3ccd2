"""A request as the engine tracks it: tokens so far, KV state in each model, counters."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch
from pcgtts.engine.acceptance import AcceptanceRule
from pcgtts.engine.block_manager import SeqBlocks
from pcgtts.engine.config import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)  # identity semantics: queues remove by identity, fields hold tensors
class Sequence:
    request_id: str
    prompt_len: int
    token_ids: list[int]  # prompt followed by generated tokens
    params: SamplingParams
    generator: torch.Generator | None  # own one when params.reproducible, else None (the engine's shared one)
    arrival: int  # FCFS order
    status: Status = Status.WAITING
    target: SeqBlocks = field(default_factory=SeqBlocks)
    draft: SeqBlocks = field(default_factory=SeqBlocks)
    # feature-head drafts: the target's hidden state [d] that produced the last token, valid while the
    # sequence holds draft_state_at tokens (engine/spec_decode.py)
    draft_state: torch.Tensor | None = None
    draft_state_at: int = -1
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    num_drafted: int = 0
    num_accepted: int = 0
    num_steps: int = 0  # decode/speculative steps this request took part in
    num_streamed: int = 0  # generated tokens already handed out by step()
    ever_admitted: bool = False
    presence: torch.Tensor | None = None  # Bool[V] tokens seen so far, kept only for repetition penalty
    rule: AcceptanceRule | None = None  # verifies this request's drafts (None: the engine has no draft)
    # Audio-deadline hint from the caller: clock time at which this request's listener runs out of audio
    # (None: no audio yet, the most urgent). Streams far ahead of their listener may sit out a step.
    deadline: float | None = None
    deferred: int = 0  # consecutive steps this sequence was ready but sat out

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len:]

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED
