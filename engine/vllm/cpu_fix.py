"""A fix for vLLM 0.32's CPU build: its Python fallback of the Triton "expand" kernel
(`vllm/utils/cpu_triton_utils.py: _expand_kernel_impl`) converts the output tensor to int64 before handing it
to the C++ kernel, so a float32 output (the per-token temperatures, top-p of speculative sampling) is a
temporary copy and the real output is never written: speculation at temperature > 0 then divides the target's
logits by uninitialised memory (most sampled tokens then have target probability < 1e-4). Greedy decoding
is unaffected. The plugin swaps in `expand`, which writes every dtype, before the CPU platform registers its
kernel overrides (vllm/v1/worker/worker_base.py loads plugins first)."""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("vllm.pcgtts")  # a child of vLLM's logger: its handlers, its format
KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


def expand(output: torch.Tensor, input_val: torch.Tensor, cu_num_tokens: torch.Tensor, replace_from,
           replace_to, MAX_NUM_TOKENS=None) -> None:  # noqa: N803 (the kernel's parameter name)
    """output[cu[i-1]:cu[i]] = input_val[i] (replace_from -> replace_to), for any dtype, in place.

    output [num_tokens], input_val [B], cu_num_tokens [B] (cumulative token counts)."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())  # [B]
    values = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype),
                         input_val)
    expanded = values.repeat_interleave(counts)
    output[:expanded.numel()] = expanded.to(output.dtype)


def install() -> bool:
    """Replace the CPU build's expand fallback (True), or leave a build without it alone (False)."""
    try:
        from vllm.utils import cpu_triton_utils
    except ImportError:
        return False
    if getattr(cpu_triton_utils, "_expand_kernel_impl", None) is None:
        return False
    if cpu_triton_utils._expand_kernel_impl is not expand:
        cpu_triton_utils._expand_kernel_impl = expand
        from vllm.triton_utils import dispatcher

        if KERNEL in getattr(dispatcher, "_registry", {}):  # overrides already registered in this process
            dispatcher.register_kernels({KERNEL: expand})
        log.warning("pcgtts: replaced vLLM's CPU expand-kernel fallback (it never wrote float outputs, so "
                 "speculative sampling at temperature > 0 used uninitialised temperatures)")
    return True
