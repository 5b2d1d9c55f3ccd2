"""Engine counters: a live set the engine updates, and the snapshot callers read."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class EngineMetrics:
    """A point-in-time view. Gauges: num_running .. kv_blocks_used; the rest are cumulative counters."""

    num_running: int
    num_waiting: int
    kv_usage: float  # target KV blocks requests hold / all blocks, 0..1 (pinned prefixes not counted)
    kv_blocks_total: int
    kv_blocks_used: int
    prompt_tokens: int
    generation_tokens: int
    spec_num_drafts: int  # (sequence, step) pairs that drafted
    spec_drafted_tokens: int
    spec_accepted_tokens: int
    spec_accepted_per_position: list[int]  # [γ] drafts accepted at position i
    preemptions: int
    steps: int  # decode/speculative steps
    batch_tokens: int  # sum over steps of sequences in the step (mean batch = batch_tokens / steps)
    finished: dict[str, int]  # finish reason -> requests
    kv_blocks_pinned: int = 0  # target blocks kept by pinned prefixes (preset voices)
    prefix_cache_queries: int = 0  # prompt tokens of admitted requests
    prefix_cache_hits: int = 0  # of which were found in the prefix cache (not prefilled)
    speculative_steps: int = 0  # decode steps that drafted and verified
    target_only_steps: int = 0  # decode steps the speculation policy ran with the target alone
    # decode forwards by the draft length they ran (0: target alone; engine.spec_policy); empty where the
    # engine does not count it
    steps_by_draft_length: dict[int, int] = field(default_factory=dict)
    # [γ] drafts verified at position i (each row's own length; empty where the engine does not count it)
    spec_drafted_per_position: list[int] = field(default_factory=list)


@dataclass
class Counters:
    num_speculative_tokens: int
    prompt_tokens: int = 0
    generation_tokens: int = 0
    spec_num_drafts: int = 0
    spec_drafted_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accepted_per_position: list[int] = field(default_factory=list)
    spec_drafted_per_position: list[int] = field(default_factory=list)
    steps: int = 0
    batch_tokens: int = 0
    finished: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.spec_accepted_per_position = [0] * self.num_speculative_tokens
        self.spec_drafted_per_position = [0] * self.num_speculative_tokens

    def record_step(self, batch: int, drafted: list[int], accepted: list[int]) -> None:
        """One decode step of `batch` sequences; drafted[i] drafts verified for sequence i, accepted[i]
        of them accepted."""
        self.steps += 1
        self.batch_tokens += batch
        self.spec_num_drafts += sum(1 for d in drafted if d)
        self.spec_drafted_tokens += sum(drafted)
        self.spec_accepted_tokens += sum(accepted)
        for k in accepted:
            for i in range(k):
                self.spec_accepted_per_position[i] += 1
        for d in drafted:
            for i in range(d):
                self.spec_drafted_per_position[i] += 1
