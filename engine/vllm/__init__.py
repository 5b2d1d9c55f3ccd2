"""vLLM as the second engine behind the TTS service, with our acceptance rules inside vLLM's verification.

    versions.py   the vLLM releases this code is written against (anything else fails with a clear message)
    settings.py   what a deployment tells vLLM's workers (rule, ASG tables), carried in vLLM's
                  `additional_config["pcgtts"]`
    plugin.py     the `vllm.general_plugins` entry point: loaded in every vLLM process, it routes vLLM's
                  rejection sampling through verify.py and mends the CPU build's expand kernel (cpu_fix.py)
    verify.py     PCG over vLLM's flattened speculative layout, on engine/ops/verify.py's plain tensor
                  functions (group_test, residual_draw, residual_thinning): one implementation, two engines
    engine.py     `VllmEngine`: vLLM's AsyncLLM behind the streaming interface the TTS service drives
    stats.py      vLLM's scheduler/iteration stats -> engine.metrics.EngineMetrics (our /metrics names)

Nothing here imports vLLM at module import time except plugin.py's functions and engine.py, so the rest of
pcgtts works without it installed (`make install-vllm` adds it).
"""
