"""Load-aware speculation: per step, the draft length γ (0: decode with the target alone) that the
measurements say gives the most tokens per second at this batch size.

On a GPU a verify step over γ+1 positions costs about one decode step at small batches, so longer drafts pay
until the batch makes the verify compute-bound; on a CPU the forward's cost grows with the tokens it scores,
so which γ pays (if any) depends on the batch, the acceptance and the machine: on the 2-core build machines
γ 5 decodes one stream 1.1-1.2x faster than γ 3 and loses to it at 6 or more (bench/results/spec-lengths/).
The policy chooses among target-only and the engine's draft lengths (`lengths`: the configured γ, plus
EngineConfig.speculation_lengths). It keeps, per batch-size class (1, 2-3, 4-7, 8-15, ...) and length,
the median of the latest steps' costs per sequence, and per length the mean of tokens emitted per sequence
over its last `window` steps (which carries the measured acceptance at that length), and picks the length
with the highest expected rate

    γ > 0: tokens_per_seq(γ) / t(class, γ)      γ = 0 (target-only): 1 / t(class, 0)

A length not yet timed in a class is tried; the lengths not chosen are re-timed in turn, one every
`retry_every` steps of that class, so a change of load or acceptance is noticed. Tokens per speculative step
vary from 1 to γ+1 step to step, and while another length wins the estimate only hears from retries, so a
short average would lock a length out after a chance dip: the mean over the last `window` steps rides out
such dips (tests/engine/test_engine_spec_policy.py), while a lasting change of acceptance moves it within
`window` steps. A speculative step right after target-only ones also feeds the draft the tokens it missed;
that switching cost is left out of the timing. Steps are timed by the engine thread's CPU time where torch
runs on that thread alone (engine.llm_engine), so other processes on a shared machine do not skew the
choice. Decisions depend only on step counts and measured times, never on a random draw; seeded requests
keep the configured γ on every step whatever the policy chooses (engine.llm_engine `_decode_groups`).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

POLICIES = ("auto", "always")


@dataclass
class _Timing:
    """The latest step times per sequence of one (batch-size class, mode); their median is the estimate,
    so one step slowed by another process on a shared machine does not decide many later steps."""

    samples: deque = field(default_factory=lambda: deque(maxlen=9))

    @property
    def seconds(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    def record(self, seconds: float) -> None:
        self.samples.append(seconds)


@dataclass
class SpeculationPolicy:
    num_speculative_tokens: int  # the configured γ ("always" runs it on every step); 0: never speculate
    mode: str = "auto"  # "auto" | "always"
    lengths: tuple[int, ...] = ()  # further draft lengths "auto" may choose (each 1 or more)
    window: int = 128  # speculative steps of one length whose tokens per sequence are averaged
    retry_every: int = 20  # steps in one batch-size class between re-timings of a length not chosen
    choices: tuple[int, ...] = field(init=False)  # what "auto" chooses among, 0 (target-only) first
    _recent_tokens: dict[int, deque] = field(init=False)  # per γ: tokens per sequence of its last steps
    _timings: dict[tuple[int, int], _Timing] = field(default_factory=dict)
    _since_retry: dict[int, int] = field(default_factory=dict)
    _next_retry: dict[int, int] = field(default_factory=dict)  # per class: which loser is re-timed next
    _last: int | None = None  # γ of the previous step
    _burst: int = 0  # speculative steps still owed to a try
    steps_by_length: dict[int, int] = field(default_factory=dict)  # decode steps run at each γ (0 included)

    def __post_init__(self) -> None:
        if self.mode not in POLICIES:
            raise ValueError(f"speculation policy must be one of {POLICIES}, not {self.mode!r}")
        if any(g < 1 for g in self.lengths):
            raise ValueError(f"speculation lengths must be 1 or more, not {self.lengths}")
        spec = sorted({self.num_speculative_tokens, *self.lengths}) if self.num_speculative_tokens else []
        self.choices = (0, *spec)
        self._recent_tokens = {g: deque(maxlen=self.window) for g in spec}

    @property
    def max_length(self) -> int:
        """The longest draft any step may run (what the engine sizes its buffers and KV look-ahead for)."""
        return self.choices[-1]

    @property
    def speculative_steps(self) -> int:
        return sum(n for g, n in self.steps_by_length.items() if g)

    @property
    def target_only_steps(self) -> int:
        return self.steps_by_length.get(0, 0)

    def tokens_per_seq(self, gamma: int | None = None) -> float | None:
        """Mean tokens per sequence of a speculative step at γ (1 + accepted drafts) over its window, the
        configured γ by default; None before its first step."""
        recent = self._recent_tokens.get(self.num_speculative_tokens if gamma is None else gamma)
        return statistics.fmean(recent) if recent else None

    def draft_length(self, batch: int) -> int:
        """γ of the next step of `batch` sequences (0: target alone)."""
        if self.num_speculative_tokens == 0:
            return 0
        if self.mode == "always":
            return self.num_speculative_tokens
        if self._burst:  # the second step of a speculative try (the first one's draft was catching up)
            self._burst -= 1
            return self._last
        untimed = [g for g in self._trial_order() if self._timing(batch, g).seconds is None]
        if untimed:  # time each length at this size
            return self._try(untimed[0])
        best = max(self.choices, key=lambda g: self.rate(batch, g))
        size = batch.bit_length()
        waited = self._since_retry.get(size, 0) + 1
        self._since_retry[size] = waited
        if waited >= self.retry_every:
            self._since_retry[size] = 0
            losers = [g for g in self.choices if g != best]
            turn = self._next_retry.get(size, 0)
            self._next_retry[size] = turn + 1
            return self._try(losers[turn % len(losers)])
        return best

    def _trial_order(self) -> list[int]:
        """The configured γ first, then the other lengths, target-only last."""
        first = self.num_speculative_tokens
        return [first] + [g for g in self.choices if g not in (0, first)] + [0]

    def _try(self, gamma: int) -> int:
        """A step at a length that is being timed: a speculative one gets two steps in a row when the draft
        is behind (after target-only steps it first catches up, a cost of the switch, not of the length)."""
        if gamma and self._last == 0:
            self._burst = 1
        return gamma

    def rate(self, batch: int, gamma: int) -> float:
        """Expected tokens per second per sequence of a step of `batch` sequences at draft length γ (0 if not
        yet timed in its class)."""
        seconds = self._timing(batch, gamma).seconds
        if not seconds:
            return 0.0
        per_seq = (self.tokens_per_seq(gamma) or 1.0) if gamma else 1.0
        return per_seq / seconds

    def record(self, batch: int, gamma: int, seconds: float, tokens: int) -> None:
        """A finished step: its batch, draft length (0: target-only), time and tokens emitted over the batch.
        The first speculative step after target-only ones is not timed: its draft was catching up on the
        tokens it missed."""
        if not (gamma and self._last == 0):
            self._timing(batch, gamma).record(seconds / batch)
        self._last = gamma
        self.steps_by_length[gamma] = self.steps_by_length.get(gamma, 0) + 1
        if gamma:
            self._recent_tokens[gamma].append(tokens / batch)

    def _timing(self, batch: int, gamma: int) -> _Timing:
        return self._timings.setdefault((batch.bit_length(), gamma), _Timing())
