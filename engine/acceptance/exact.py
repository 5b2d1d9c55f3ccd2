"""Standard speculative sampling (Leviathan et al. 2023; Chen et al. 2023), q = target, p = draft.

Accept x_i with probability min(1, q_i(x_i)/p_i(x_i)); at the first rejection draw from norm[q_i - p_i]_+;
after γ acceptances draw the bonus token from q_{γ+1}. The emitted tokens are distributed exactly as q.
The verify is engine/ops/verify.py's TOKEN_VERIFY, as torch ops or as a compiled CPU loop.
"""

from __future__ import annotations

from pcgtts.engine.acceptance.base import TokenLevelRule
from pcgtts.engine.acceptance.verdict import Verdict
from pcgtts.engine.ops import Ops
from pcgtts.engine.ops.verify import TOKEN_VERIFY, ratio_test, singleton_layout, verify_tokens


class ExactRule(TokenLevelRule):
    name = "exact"
    has_compiled_form = True

    def __init__(self, ops: Ops | None = None):
        """ops: the forms of the verify (engine/ops); None: the one that applies to each call's tensors."""
        self.ops = ops

    def accept(self, draft_tokens, draft_probs, target_probs, u):
        return ratio_test(draft_tokens, draft_probs, target_probs, u)

    def verify(self, draft_tokens, draft_probs, target_probs, generator=None) -> Verdict:
        return verify_tokens(TOKEN_VERIFY, self.ops, draft_tokens, draft_probs, target_probs, generator)

    def sibling_layout(self, vocab_size, device):
        return singleton_layout(vocab_size)
