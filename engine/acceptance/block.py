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
stop as in token-level verification). The math is engine/ops/verify.py's BLOCK_VERIFY (a compiled loop on
CPU, torch ops elsewhere); its torch steps also run over ASG group labels in pcg_block.py.
"""

from __future__ import annotations

from pcgtts.engine.acceptance.base import AcceptanceRule
from pcgtts.engine.acceptance.verdict import Verdict
from pcgtts.engine.ops import Ops
from pcgtts.engine.ops.verify import BLOCK_VERIFY, verify_tokens


class BlockRule(AcceptanceRule):
    name = "block"
    row_draws = True  # accept (η_1..η_γ), then emit, each uniform((B, ...)) whatever the data
    has_compiled_form = True

    def __init__(self, ops: Ops | None = None):
        """ops: the forms of the verify (engine/ops); None: the one that applies to each call's tensors."""
        self.ops = ops

    def verify(self, draft_tokens, draft_probs, target_probs, generator=None) -> Verdict:
        return verify_tokens(BLOCK_VERIFY, self.ops, draft_tokens, draft_probs, target_probs, generator)
