"""The batching engine: a Llama-family model over a paged KV cache with speculative decoding.

Public API: `Engine`, `EngineConfig`, `SamplingParams`, `Generation`; the asyncio streaming front is
`engine.async_engine.AsyncEngine`. Speech families (`engine.speech`), codecs (`engine.codec`) and acceptance
rules (`engine.acceptance`) plug in through their base classes. The engine imports neither the TTS service
(`tts`) nor the server; see the README's "Architecture".

`Engine`, `Generation` and `RequestOutput` load on first use: importing a submodule (the vLLM plugin,
engine/vllm/plugin.py, which vLLM imports in each of its processes before it registers its CPU kernels)
must not pull in the whole engine and its compiled loops (numba/llvmlite, whose objects vLLM's kernel
registry scan trips over).
"""

from pcgtts.engine.config import EngineConfig, SamplingParams

__all__ = ["Engine", "EngineConfig", "Generation", "RequestOutput", "SamplingParams"]


def __getattr__(name: str):
    if name in ("Engine", "Generation", "RequestOutput"):
        from pcgtts.engine import llm_engine

        return getattr(llm_engine, name)
    raise AttributeError(f"module 'pcgtts.engine' has no attribute {name!r}")
