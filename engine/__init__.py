"""The batching engine: a Llama-family model over a paged KV cache with speculative decoding.

Public API: `Engine`, `EngineConfig`, `SamplingParams`, `Generation`; the asyncio streaming front is
`engine.async_engine.AsyncEngine`. Speech families (`engine.speech`), codecs (`engine.codec`) and acceptance
rules (`engine.acceptance`) plug in through their base classes. The engine imports neither the TTS service
(`tts`) nor the server; see the README's "Architecture".
"""

from pcgtts.engine.config import EngineConfig, SamplingParams
from pcgtts.engine.llm_engine import Engine, Generation, RequestOutput

__all__ = ["Engine", "EngineConfig", "Generation", "RequestOutput", "SamplingParams"]
