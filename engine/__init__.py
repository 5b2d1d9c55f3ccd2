"""The batching engine: a Llama-family model over a paged KV cache with speculative decoding.

Public API (DESIGN.md "engine"): `Engine`, `EngineConfig`, `SamplingParams`, `Generation`; the asyncio
streaming front is `engine.async_engine.AsyncEngine`.
"""

from engine.config import EngineConfig, SamplingParams
from engine.llm_engine import Engine, Generation, RequestOutput

__all__ = ["Engine", "EngineConfig", "Generation", "RequestOutput", "SamplingParams"]
