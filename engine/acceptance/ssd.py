"""SSD (Lin et al., Interspeech 2025): standard speculative sampling with an additive tolerance β.

Accept x_i if u < min(1, q_i(x_i)/p_i(x_i)) + β; rejection draws from norm[q_i - p_i]_+ as in `exact`.
β = 0 is exact speculative sampling; any β > 0 gives up exactness for acceptance (the PCG paper ran β = 0.3,
the SSD paper β = 0.4).
"""

from __future__ import annotations

from pcgtts.engine.acceptance.base import TokenLevelRule
from pcgtts.engine.ops.verify import ratio_test


class SSDRule(TokenLevelRule):
    name = "ssd"

    def __init__(self, bias: float = 0.3):
        if bias < 0:
            raise ValueError("ssd bias must be >= 0")
        self.bias = float(bias)

    def accept(self, draft_tokens, draft_probs, target_probs, u):
        return ratio_test(draft_tokens, draft_probs, target_probs, u, bias=self.bias)

    def __repr__(self) -> str:
        return f"SSDRule(bias={self.bias})"
