"""Block verification (Sun et al., "Block Verification Accelerates Speculative Decoding", ICLR 2025),
q = target, p = draft: the draft block is accepted jointly instead of token by token. The emitted tokens are
distributed exactly as q, and the expected number accepted (over the drafts) is at least that of token-level
verification (`exact`); for a given draft block it can be smaller.

Per row, with the running weight w_0 = 1, w_j = min(w_{j-1} q_{j-1}(x_{j-1}) / p_{j-1}(x_{j-1}), 1) after
j drafts (the clipped joint likelihood ratio of the prefix) and the residual mass r_j = Σ_x [w_j q_j(x) -
p_j(x)]_+ of position j:
  for j = 1..γ: mark j with probability h_j = r_j / (r_j + 1 - w_j) (j < γ; 0 where both vanish), h_γ = w_γ;
  τ = the last marked j (0 if none): keep x_0..x_{τ-1};
  emit one token at position τ from norm[w_τ q_τ - p_τ]_+ (p_γ = 0: the bonus slot samples q_γ).
Every j is tested with its own uniform, however the earlier tests went (τ is the *last* mark, not the first
stop as in token-level verification). The same steps run over ASG group labels in pcg_block.py.
"""

from __future__ import annotations

import torch
from pcgtts.engine.acceptance.base import AcceptanceRule, assemble, check_shapes, token_probs
from pcgtts.engine.acceptance.sampling import VerifyUniforms, sample_rows
from pcgtts.engine.acceptance.verdict import Verdict


def running_weights(target_mass: torch.Tensor, draft_mass: torch.Tensor) -> torch.Tensor:
    """w [B, γ+1] (float64) from the drafts' target and draft masses [B, γ]: w_0 = 1, w_{j+1} = min(w_j ·
    target_mass_j / draft_mass_j, 1). A draft mass of 0 (a draft the draft could not have made) keeps any
    positive weight at 1, as the ratio test accepts such a token iff its target mass is positive."""
    q, p = target_mass.double(), draft_mass.double()
    weights = [torch.ones_like(q[:, 0])]
    for j in range(q.shape[1]):
        scaled = weights[-1] * q[:, j]
        weights.append(torch.where(scaled >= p[:, j], 1.0, scaled / p[:, j].clamp(min=1e-300)) * (scaled > 0))
    return torch.stack(weights, dim=1)


def weighted_excess(weights: torch.Tensor, target: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """w_j q_j - p_j at every position, [B, γ+1, X] float32 (p = 0 at the bonus slot j = γ), from
    weights [B, γ+1], target [B, γ+1, X] and draft [B, γ, X] (X: tokens, or groups for pcg-block)."""
    excess = target.float() * weights[:, :, None].float()
    excess[:, :-1] -= draft.float()
    return excess


def stop_position(weights: torch.Tensor, excess: torch.Tensor, eta: torch.Tensor) -> torch.Tensor:
    """τ Long[B]: the last j in 1..γ with eta_{j-1} < h_j (0 if none), from weights [B, γ+1], the weighted
    excess [B, γ+1, X] and uniforms eta Float64[B, γ]. The tests are written without division, so that
    h_j = 0/0 (w_j = 1 with p_j = q_j: nothing left to draw there) marks nothing."""
    g = eta.shape[1]
    if g == 0:
        return torch.zeros(eta.shape[0], dtype=torch.long, device=eta.device)
    mass = excess[:, 1:g].clamp(min=0.0).sum(-1).double()  # r_j for j = 1..γ-1: [B, γ-1]
    inner = eta[:, :g - 1] * (mass + 1.0 - weights[:, 1:g]) < mass  # η < r / (r + 1 - w)
    marked = torch.cat([inner, (eta[:, g - 1] < weights[:, g])[:, None]], dim=1)  # [B, γ]
    return (marked.long() * torch.arange(1, g + 1, device=eta.device)).amax(dim=1)


def residual_rows(excess: torch.Tensor, target: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """[w_τ q_τ - p_τ]_+ of each row, [B, X] float32, or q_τ where that vanishes (only through rounding: a
    position with no residual mass is never marked, and τ = 0 has mass unless p_0 = q_0, which marks a
    later position surely)."""
    rows = torch.arange(excess.shape[0], device=excess.device)
    residual = excess[rows, tau].clamp_(min=0.0)
    empty = torch.nonzero(residual.sum(-1) <= 0).flatten()
    if empty.numel():
        residual[empty] = target[empty, tau[empty]].float()
    return residual


class BlockRule(AcceptanceRule):
    name = "block"
    row_draws = True  # accept (η_1..η_γ), then emit, each uniform((B, ...)) whatever the data

    def verify(self, draft_tokens, draft_probs, target_probs, generator=None) -> Verdict:
        check_shapes(draft_tokens, draft_probs, target_probs)
        b, g = draft_tokens.shape
        u = VerifyUniforms.draw(generator, b, g, draft_probs.device)
        weights = running_weights(token_probs(target_probs[:, :g], draft_tokens),
                                  token_probs(draft_probs, draft_tokens))  # [B, γ+1]
        excess = weighted_excess(weights, target_probs, draft_probs)  # [B, γ+1, V]
        tau = stop_position(weights, excess, u.accept)
        last = sample_rows(residual_rows(excess, target_probs, tau), None, u=u.emit)
        return assemble(draft_tokens, tau, last)
