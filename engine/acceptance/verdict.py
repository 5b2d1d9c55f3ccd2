"""The result of verifying one speculation round for a batch of sequences."""

from __future__ import annotations

from collections.abc import Callable

import torch


class Verdict:
    """What a rule decided for each of B sequences after one draft of γ tokens.

    tokens:       Long[B, γ+1]  accepted draft tokens, then one recovered (after a rejection) or bonus (after
                                 γ acceptances) token; the rest padded with -1.
    num_accepted: Long[B]       accepted draft tokens, in [0, γ].
    groups:       Long[B, γ+1]  pcg and pcg-block: the group label K of each emitted token (the accepted
                                 label, or the residual group after a rejection); -1 for the bonus token, for
                                 padding and for other rules. Built on first access (the engine never reads
                                 it; at decode sizes each tensor op counts).
    """

    def __init__(self, tokens: torch.Tensor, num_accepted: torch.Tensor,
                 groups: torch.Tensor | Callable[[], torch.Tensor]):
        self.tokens = tokens
        self.num_accepted = num_accepted
        self._groups = groups

    @property
    def groups(self) -> torch.Tensor:
        if callable(self._groups):
            self._groups = self._groups()
        return self._groups

    @property
    def num_emitted(self) -> torch.Tensor:  # Long[B] in [1, γ+1]
        return self.num_accepted + 1
