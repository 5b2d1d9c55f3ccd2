"""The streaming interface the TTS service drives: one per engine behind it.

Two engines implement it: the built-in one (`engine.async_engine.AsyncEngine`, every device) and vLLM
(`engine.vllm.engine.VllmEngine`, for GPUs). The service uses these members and nothing else of an engine,
so it never needs to know which one it holds; `tests/engine/test_streaming_interface.py` checks that both
provide every member.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pcgtts.engine.async_engine import TokenDelta
    from pcgtts.engine.config import EngineConfig, SamplingParams
    from pcgtts.engine.metrics import EngineMetrics


class StreamingEngine(Protocol):
    name: str  # "builtin" | "vllm", as /v1/models reports it
    config: EngineConfig  # what it was built from (rule, γ, tables, limits)
    # the acceptance rules a request may choose (engine.acceptance.RULES or a subset)
    acceptance_rules: Sequence[str]
    per_request_gamma: bool  # whether a request may verify fewer drafts than the engine's γ
    fault: str | None  # why it failed every request and takes no more, if it did

    @property
    def vocab_size(self) -> int: ...

    @property
    def num_speculative_tokens(self) -> int: ...

    def stream(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None,
               continuing: bool = False) -> AsyncIterator[TokenDelta]:
        """Token deltas of one request in order, the last with finished=True; closing the iterator aborts
        the request and frees its KV."""

    def abort(self, request_id: str) -> None:
        """From the event loop: end a request's stream."""

    def set_deadline(self, request_id: str, deadline: float | None) -> None:
        """When the request's listener runs out of audio (monotonic seconds), for deadline scheduling."""

    def pin_prefix(self, token_ids: list[int], lru: bool = False) -> None:
        """Keep a prompt prefix (a voice's reference codes) in the prefix cache."""

    def metrics(self) -> EngineMetrics:
        """Gauges and cumulative counters as of the latest step."""

    def shutdown(self) -> None: ...
