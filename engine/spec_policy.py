"""Load-aware speculation: per step, the draft length γ (0: decode with the target alone) that the
measurements say gives the most tokens per second at this batch size.

On a GPU a verify step over γ+1 positions costs about one decode step at small batches, so longer drafts pay
until the batch makes the verify compute-bound; on a CPU the forward's cost grows with the tokens it scores,
so which γ pays (if any) depends on the batch, the acceptance and the machine. The policy chooses among
target-only and the engine's draft lengths (`lengths`: the configured γ, plus
EngineConfig.speculation_lengths), per batch-size class (1, 2-3, 4-7, 8-15, ...), the length with the
highest expected rate

    γ > 0: tokens_per_seq(γ) / t(class, γ)      γ = 0 (target-only): 1 / t(class, 0)

t is the median cost per sequence of the length's latest `trial_steps` steps in the class, and
tokens_per_seq(γ) the mean tokens emitted per sequence over its last `window` steps (which carries the
measured acceptance at that length; a lasting change of acceptance moves it within `window` steps, chance
dips do not, tests/engine/test_engine_spec_policy.py).

The choice is made by trials: each length is first run for `trial_steps` timed steps in turn, and the best
kept; every `retry_every` steps of the class one length not chosen (in turn) runs `trial_steps` timed steps
again and replaces the chosen one if it now rates higher (one that stays well behind is tried less and less
often, so exploring costs little where the lengths differ much). A step's cost grows with the context its rows
attend to, so the two are compared on steps taken back to back (the chosen length's latest steps and the
trial's), not on a loser's samples from hundreds of tokens ago, which would favour whichever length ran
least recently; between trials the choice stands. A speculative step right after target-only ones also
feeds the draft the tokens it missed; that switching cost is left out of the timing (the trial runs one
step more). Steps are timed by the engine thread's CPU time where torch runs on that thread alone
(engine.llm_engine), so other processes on a shared machine do not skew the choice. Decisions depend only
on step counts and measured times, never on a random draw; seeded requests keep the configured γ on every
step whatever the policy chooses (engine.llm_engine `_decode_groups`).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

POLICIES = ("auto", "always")


@dataclass
class _Timing:
    """The latest step times per sequence of one (batch-size class, length); their median is the estimate,
    so one step slowed by another process on a shared machine does not decide the choice."""

    samples: deque

    @property
    def seconds(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None


@dataclass
class _Class:
    """The policy's state in one batch-size class."""

    best: int | None = None  # the length chosen; None until every length has had its first trial
    trial: int | None = None  # the length being timed now
    trial_timed: int = 0  # timed steps of the trial so far
    steps: int = 0  # steps of the class run at the chosen length
    due: dict[int, int] = field(default_factory=dict)  # length -> `steps` at which it is next tried
    interval: dict[int, int] = field(default_factory=dict)  # length -> steps between its trials


@dataclass
class SpeculationPolicy:
    num_speculative_tokens: int  # the configured γ ("always" runs it on every step); 0: never speculate
    mode: str = "auto"  # "auto" | "always"
    lengths: tuple[int, ...] = ()  # further draft lengths "auto" may choose (positive integers)
    window: int = 128  # speculative steps of one length whose tokens per sequence are averaged
    retry_every: int = 20  # steps in one batch-size class between trials of a length not chosen
    trial_steps: int = 4  # timed steps per trial (and per estimate)
    choices: tuple[int, ...] = field(init=False)  # what "auto" chooses among, 0 (target-only) first
    _recent_tokens: dict[int, deque] = field(init=False)  # per γ: tokens per sequence of its last steps
    _timings: dict[tuple[int, int], _Timing] = field(default_factory=dict)
    _classes: dict[int, _Class] = field(default_factory=dict)
    _last: int | None = None  # γ of the previous step
    steps_by_length: dict[int, int] = field(default_factory=dict)  # decode steps run at each γ (0 included)

    BACK_OFF = 0.9  # a length rating under this fraction of the chosen one's is re-tried less and less often

    def __post_init__(self) -> None:
        if self.mode not in POLICIES:
            raise ValueError(f"speculation policy must be one of {POLICIES}, not {self.mode!r}")
        if any(not isinstance(g, int) or isinstance(g, bool) or g < 1 for g in self.lengths):
            raise ValueError(f"speculation_lengths must be positive integers, not {self.lengths!r}")
        gamma = self.num_speculative_tokens
        # "always" runs γ alone, whatever further lengths are configured
        spec = sorted({gamma, *self.lengths} if self.mode == "auto" else {gamma}) if gamma else []
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
        c = self._classes.setdefault(batch.bit_length(), _Class())
        trial_done = c.trial is not None and c.trial_timed >= self.trial_steps
        if trial_done or (c.trial is None and c.best is None):  # a trial ended, or the class is new
            self._next_trial(batch, c)
        if c.trial is not None:
            return c.trial
        c.steps += 1
        due = [g for g in self._trial_order() if g != c.best and c.due[g] <= c.steps]
        if due:
            c.trial = min(due, key=lambda g: c.due[g])
            return c.trial
        return c.best

    def _trial_order(self) -> list[int]:
        """The configured γ first, then the other lengths, target-only last."""
        first = self.num_speculative_tokens
        return [first] + [g for g in self.choices if g not in (0, first)] + [0]

    def _next_trial(self, batch: int, c: _Class) -> None:
        """At the start, or once a trial has its timed steps: the first trials go on to the next untried
        length, then pick the best; a re-trial replaces the chosen length if it rates higher on these fresh
        steps (the chosen length's latest ones were taken just before). A length that stays well behind
        (under BACK_OFF of the chosen one's rate) is tried half as often each time, down to an eighth as
        often, so exploring a hopeless length costs little."""
        tried, order = c.trial, self._trial_order()
        c.trial, c.trial_timed = None, 0
        every = self.retry_every * (len(order) - 1)  # each length not chosen: one trial in `every` steps
        untried = [g for g in order if self._timing(batch, g).seconds is None]
        if untried:
            c.trial = untried[0]
            return
        if c.best is None:
            c.best = max(order, key=lambda g: self.rate(batch, g))
            for i, g in enumerate(g for g in order if g != c.best):  # staggered, one trial at a time
                c.interval[g], c.due[g] = every, c.steps + (i + 1) * self.retry_every
            return
        if self.rate(batch, tried) > self.rate(batch, c.best):
            tried, c.best = c.best, tried  # the former choice is now the one re-tried
            c.interval[tried] = every
        elif self.rate(batch, tried) < self.BACK_OFF * self.rate(batch, c.best):
            c.interval[tried] = min(2 * c.interval[tried], 8 * every)
        else:
            c.interval[tried] = every
        c.due[tried] = c.steps + c.interval[tried]

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
            self._timing(batch, gamma).samples.append(seconds / batch)
            c = self._classes.get(batch.bit_length())
            if c is not None and c.trial == gamma:
                c.trial_timed += 1
        self._last = gamma
        self.steps_by_length[gamma] = self.steps_by_length.get(gamma, 0) + 1
        if gamma:
            self._recent_tokens[gamma].append(tokens / batch)

    def _timing(self, batch: int, gamma: int) -> _Timing:
        key = (batch.bit_length(), gamma)
        if key not in self._timings:
            self._timings[key] = _Timing(deque(maxlen=self.trial_steps))
        return self._timings[key]
