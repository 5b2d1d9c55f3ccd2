"""Attention at a batch-16 decode step's shapes (4 heads of 64, 400 cached tokens, 1 or γ+1 = 4 query tokens),
one thread: SDPA over the KV mirror's token-major layout (what the engine runs), over head-major contiguous
K/V (a layout change the profile suggested), and as plain matmul + softmax. Medians of 7 x 50 calls.

    .venv/bin/python bench/results/capacity/profile/attention_probe.py \
        > bench/results/capacity/profile/attention_probe.txt
"""

import statistics
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(1)
BATCH, HEADS, HEAD_DIM, CONTEXT, CAPACITY = 16, 4, 64, 400, 512


def median_ms(call) -> float:
    for _ in range(20):
        call()
    times = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(50):
            call()
        times.append((time.perf_counter() - start) / 50)
    return 1e3 * statistics.median(times)


for tokens in (1, 4):
    q = torch.randn(BATCH, tokens, HEADS, HEAD_DIM).transpose(1, 2)  # [B, H, T, D]
    keys = torch.randn(BATCH, CAPACITY, HEADS, HEAD_DIM)[:, :CONTEXT]  # the mirror's [B, ctx, H, D] views
    values = torch.randn(BATCH, CAPACITY, HEADS, HEAD_DIM)[:, :CONTEXT]
    mask = torch.zeros(BATCH, 1, tokens, CONTEXT)
    keys_h, values_h = keys.transpose(1, 2).contiguous(), values.transpose(1, 2).contiguous()
    forms = {
        "sdpa, token-major views": lambda: F.scaled_dot_product_attention(  # noqa: B023
            q, keys.transpose(1, 2), values.transpose(1, 2), attn_mask=mask),  # noqa: B023
        "sdpa, head-major contiguous": lambda: F.scaled_dot_product_attention(  # noqa: B023
            q, keys_h, values_h, attn_mask=mask),  # noqa: B023
        "matmul + softmax": lambda: torch.matmul(torch.softmax(  # noqa: B023
            torch.matmul(q, keys.permute(0, 2, 3, 1)) * HEAD_DIM ** -0.5 + mask, -1),  # noqa: B023
            values.transpose(1, 2)),  # noqa: B023
    }
    results = {name: median_ms(call) for name, call in forms.items()}
    reference = results["sdpa, token-major views"]
    print(f"{tokens} query token(s): " + ", ".join(f"{name} {ms:.3f} ms ({ms / reference:.2f}x)"
                                                 for name, ms in results.items()))
