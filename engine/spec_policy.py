"""Load-aware speculation: per step, speculate (draft γ + verify) or decode with the target alone,
whichever the measurements say gives more tokens per second at this batch size.

On a GPU a verify step over γ+1 positions costs about one decode step, so speculation pays at any batch;
on a CPU the forward's cost grows with the tokens it scores, so whether it pays depends on the batch,
the acceptance and the machine. The policy keeps, per batch-size class (1, 2-3, 4-7,
8-15, ...) and mode, the median of the latest steps' costs per sequence, and the mean of tokens emitted
per sequence over the last `window` speculative steps (which carries the measured acceptance), and picks
the mode with the higher expected rate

    speculative: tokens_per_seq / t_spec_per_seq(class)      target-only: 1 / t_target_per_seq(class)

A mode not yet timed in a class is tried; the losing mode is re-timed every `retry_every` steps of that
class, so a change of load or acceptance is noticed. Tokens per speculative step vary from 1 to γ+1 step
to step, and while target-only wins the estimate only hears from retries, so a short average would lock
speculation out after a chance dip: the mean over the last `window` speculative steps rides out such dips
(tests/engine/test_engine_spec_policy.py), while a lasting change of acceptance moves it within `window`
steps. A speculative step right after target-only ones also feeds the draft the tokens it missed; that
switching cost is left out of the timing. Steps are timed by the engine thread's CPU time where torch runs
on that thread alone (engine.llm_engine), so other processes on a shared machine do not skew the choice.
Decisions depend only on step counts and measured times, never on a random draw, so the per-request
generators see the same draws for the same decisions.
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
    num_speculative_tokens: int  # γ of the engine; 0: never speculate
    mode: str = "auto"  # "auto" | "always"
    window: int = 128  # speculative steps whose tokens per sequence are averaged
    retry_every: int = 20  # steps in one batch-size class between re-timings of the mode not chosen
    _recent_tokens: deque = field(init=False)  # tokens per sequence of the last `window` speculative steps
    _timings: dict[tuple[int, bool], _Timing] = field(default_factory=dict)
    _since_retry: dict[int, int] = field(default_factory=dict)
    _last: bool | None = None  # mode of the previous step
    _burst: int = 0  # speculative steps still owed to a try
    speculative_steps: int = 0
    target_only_steps: int = 0

    def __post_init__(self) -> None:
        if self.mode not in POLICIES:
            raise ValueError(f"speculation policy must be one of {POLICIES}, not {self.mode!r}")
        self._recent_tokens = deque(maxlen=self.window)

    @property
    def tokens_per_seq(self) -> float | None:
        """Mean tokens per sequence of a speculative step (1 + accepted drafts) over the window; None
        before the first."""
        return statistics.fmean(self._recent_tokens) if self._recent_tokens else None

    def speculate(self, batch: int) -> bool:
        """Whether the next step of `batch` sequences should speculate."""
        if self.num_speculative_tokens == 0:
            return False
        if self.mode == "always":
            return True
        if self._burst:  # the second step of a speculative try (the first one's draft was catching up)
            self._burst -= 1
            return True
        spec, plain = self._timing(batch, True), self._timing(batch, False)
        if spec.seconds is None or plain.seconds is None:  # time each mode at this size
            return self._try(spec.seconds is None)
        better = self.rate(batch, True) >= self.rate(batch, False)
        size = batch.bit_length()
        waited = self._since_retry.get(size, 0) + 1
        self._since_retry[size] = waited
        if waited >= self.retry_every:
            self._since_retry[size] = 0
            return self._try(not better)
        return better

    def _try(self, speculative: bool) -> bool:
        """A step in a mode that is being timed: speculation gets two steps in a row when the draft is
        behind (after target-only steps it first catches up, a cost of the switch, not of the mode)."""
        if speculative and self._last is False:
            self._burst = 1
        return speculative

    def rate(self, batch: int, speculative: bool) -> float:
        """Expected tokens per second per sequence of a step of `batch` sequences in this mode (0 if not yet
        timed in its class)."""
        seconds = self._timing(batch, speculative).seconds
        if not seconds:
            return 0.0
        per_seq = (self.tokens_per_seq or 1.0) if speculative else 1.0
        return per_seq / seconds

    def record(self, batch: int, speculative: bool, seconds: float, tokens: int) -> None:
        """A finished step: its batch, mode, time and tokens emitted over the batch. The first speculative
        step after target-only ones is not timed: its draft was catching up on the tokens it missed."""
        if not (speculative and self._last is False):
            self._timing(batch, speculative).record(seconds / batch)
        self._last = speculative
        if speculative:
            self.speculative_steps += 1
            self._recent_tokens.append(tokens / batch)
        else:
            self.target_only_steps += 1

    def _timing(self, batch: int, speculative: bool) -> _Timing:
        return self._timings.setdefault((batch.bit_length(), speculative), _Timing())
