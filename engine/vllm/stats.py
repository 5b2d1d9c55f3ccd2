"""vLLM's per-step statistics -> our engine's counters (engine.metrics.EngineMetrics), so `/metrics` shows
the same `pcgtts:` names (and the provisioned Grafana dashboard works unchanged) whichever engine serves.

vLLM hands each step's `SchedulerStats` (running/waiting requests, KV use, prefix-cache queries and hits,
spec-decode drafts/draft tokens/accepted tokens per position) and `IterationStats` (prompt and generation
tokens, preemptions, finished requests) to the stat loggers it is given (`AsyncLLM(stat_loggers=...)`), in
the front-end process, on its output loop; `VllmCounters` sums them and publishes a snapshot."""

from __future__ import annotations

import threading
from collections import Counter

from pcgtts.engine.metrics import EngineMetrics


class VllmCounters:
    """Cumulative counters and the latest gauges of one vLLM engine."""

    def __init__(self, gamma: int):
        self.gamma = gamma
        self._lock = threading.Lock()
        self._sums = Counter()
        self._per_position = [0] * gamma
        self._finished: Counter = Counter()
        self._gauges = {"num_running": 0, "num_waiting": 0, "kv_usage": 0.0}

    def record(self, scheduler_stats, iteration_stats) -> None:
        with self._lock:
            if scheduler_stats is not None:
                self._gauges = {"num_running": scheduler_stats.num_running_reqs,
                                "num_waiting": scheduler_stats.num_waiting_reqs,
                                "kv_usage": float(scheduler_stats.kv_cache_usage)}
                cache = scheduler_stats.prefix_cache_stats
                if cache is not None:
                    self._sums["prefix_cache_queries"] += cache.queries
                    self._sums["prefix_cache_hits"] += cache.hits
                spec = scheduler_stats.spec_decoding_stats
                if spec is not None:
                    self._sums["spec_num_drafts"] += spec.num_drafts
                    self._sums["spec_drafted_tokens"] += spec.num_draft_tokens
                    self._sums["spec_accepted_tokens"] += spec.num_accepted_tokens
                    self._sums["speculative_steps"] += bool(spec.num_drafts)
                    for i, n in enumerate(spec.num_accepted_tokens_per_pos[:self.gamma]):
                        self._per_position[i] += n
            if iteration_stats is not None:
                self._sums["prompt_tokens"] += iteration_stats.num_prompt_tokens
                self._sums["generation_tokens"] += iteration_stats.num_generation_tokens
                self._sums["preemptions"] += iteration_stats.num_preempted_reqs
                self._sums["steps"] += bool(iteration_stats.num_generation_tokens)
                for done in iteration_stats.finished_requests:
                    self._finished[str(done.finish_reason)] += 1

    def snapshot(self) -> EngineMetrics:
        with self._lock:
            s = self._sums
            return EngineMetrics(
                **self._gauges, kv_blocks_total=0, kv_blocks_used=0,
                prompt_tokens=s["prompt_tokens"], generation_tokens=s["generation_tokens"],
                spec_num_drafts=s["spec_num_drafts"], spec_drafted_tokens=s["spec_drafted_tokens"],
                spec_accepted_tokens=s["spec_accepted_tokens"],
                spec_accepted_per_position=list(self._per_position), preemptions=s["preemptions"],
                steps=s["steps"], batch_tokens=0, finished=dict(self._finished),
                prefix_cache_queries=s["prefix_cache_queries"], prefix_cache_hits=s["prefix_cache_hits"],
                speculative_steps=s["speculative_steps"],
                target_only_steps=max(0, s["steps"] - s["speculative_steps"]) if self.gamma else s["steps"])


def stat_logger_factory(counters: VllmCounters):
    """A vLLM StatLoggerFactory feeding `counters` (vLLM's base class is imported only here)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class PcgttsStatLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            self.engine_index = engine_index

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            counters.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self):
            pass

    return PcgttsStatLogger
