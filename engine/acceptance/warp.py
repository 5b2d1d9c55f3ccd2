"""Logits -> sampling probabilities: the one place temperature, top-k and top-p are applied.

The engine calls `logits_to_probs` on the draft logits [B, γ, V] and on the target logits [B, γ+1, V] with
the same per-sequence parameters, so that the acceptance rules compare the two distributions the user
actually asked for. (Speculative sampling is exact with respect to whatever q it is given; warping only
one side would silently change the output distribution.)

Conventions, per sequence (row b of the leading dimension):
- temperature 0 (or below GREEDY_EPS) means greedy: a one-hot on the argmax (first index on ties), so
  that `exact` speculative decoding reproduces target-only greedy decoding token for token;
- top_k <= 0 or >= V disables top-k; top_p >= 1 disables top-p. Top-k is applied before top-p, both on
  the temperature-scaled logits; the top-p cut keeps the smallest prefix of the sorted distribution whose
  mass reaches top_p (the token that crosses top_p is kept), as Hugging Face does.
"""

from __future__ import annotations

import torch

GREEDY_EPS = 1e-5

Param = float | int | torch.Tensor | None


def _per_row(value: Param, default: float, logits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A parameter as a tensor broadcastable against logits[..., :1] (scalar or one value per row b)."""
    if value is None:
        value = default
    t = torch.as_tensor(value, dtype=dtype, device=logits.device)
    if t.dim() == 0:
        return t.expand(logits.shape[:-1]).unsqueeze(-1)
    if t.shape[0] != logits.shape[0]:
        raise ValueError(f"per-row parameter of length {t.shape[0]} for logits {tuple(logits.shape)}")
    return t.reshape(t.shape[0], *([1] * (logits.dim() - 1))).expand(*logits.shape[:-1], 1)


def logits_to_probs(
    logits: torch.Tensor, temperature: Param = 1.0, top_k: Param = 0, top_p: Param = 1.0
) -> torch.Tensor:
    """Float probabilities [..., V] from logits [..., V]; parameters are scalars or one value per row b.

    Computation is in float32 whatever the logits dtype."""
    logits = logits.float()
    vocab = logits.shape[-1]
    temp = _per_row(temperature, 1.0, logits, torch.float32)  # [..., 1]
    greedy = temp <= GREEDY_EPS
    scaled = logits / torch.where(greedy, torch.ones_like(temp), temp)

    k = _per_row(top_k, 0, logits, torch.long)
    k = torch.where((k <= 0) | (k >= vocab), torch.full_like(k, vocab), k)
    p = _per_row(top_p, 1.0, logits, torch.float32).clamp(min=1e-8)  # top_p <= 0 keeps the top token only
    if bool((k < vocab).any()) and not bool((p < 1.0).any()):
        # top-k only: a partial top-k (largest k over rows) is far cheaper than a full sort of V.
        kmax = int(k.max())
        top_vals = torch.topk(scaled, kmax, dim=-1).values  # [..., kmax] descending
        kth = torch.gather(top_vals, -1, k.clamp(max=kmax) - 1)  # [..., 1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    elif bool((p < 1.0).any()):
        sorted_vals, sorted_idx = torch.sort(scaled, dim=-1, descending=True)
        # top-k by value, as the branch above (ties with the k-th value kept), so that a row's cut does not
        # depend on whether a batch mate asked for top-p
        kth = torch.gather(sorted_vals, -1, k - 1)  # [..., 1]
        sorted_vals = sorted_vals.masked_fill(sorted_vals < kth, float("-inf"))
        sorted_probs = torch.softmax(sorted_vals, dim=-1)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        # rows without top-p are never cut: their cumulative sum may round up to 1 before its last token
        sorted_vals = sorted_vals.masked_fill((mass_before >= p) & (p < 1.0), float("-inf"))
        scaled = torch.full_like(scaled, float("-inf")).scatter(-1, sorted_idx, sorted_vals)

    probs = torch.softmax(scaled, dim=-1)
    if bool(greedy.any()):
        one_hot = torch.zeros_like(probs).scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(greedy, one_hot, probs)
    return probs
