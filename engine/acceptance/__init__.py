"""Acceptance rules of speculative decoding: the only place acceptance math lives.

    rule = make_rule("exact")   # or "pcg" (table=), "ssd" (bias=), "topk" (k=), "lantern" (k=, delta=, ...)
    verdict = rule.verify(draft_tokens, draft_probs, target_probs, generator)

Both probability tensors must come from `logits_to_probs` with the same sampling parameters (warp.py).
"""

from __future__ import annotations

import importlib

from engine.acceptance.base import AcceptanceRule
from engine.acceptance.verdict import Verdict
from engine.acceptance.warp import logits_to_probs

# name -> "module:Class"; constructors take the rule's keyword parameters.
RULES = {
    "exact": "engine.acceptance.exact:ExactRule",
    "pcg": "engine.acceptance.pcg:PCGRule",
    "ssd": "engine.acceptance.ssd:SSDRule",
    "topk": "engine.acceptance.topk:TopKRule",
    "lantern": "engine.acceptance.lantern:LanternRule",
}


def make_rule(name: str, **params) -> AcceptanceRule:
    """An acceptance rule by name; see RULES and each class for its parameters."""
    if name not in RULES:
        raise ValueError(f"unknown acceptance rule {name!r}; choose from {sorted(RULES)}")
    module, cls = RULES[name].split(":")
    return getattr(importlib.import_module(module), cls)(**params)


__all__ = ["RULES", "AcceptanceRule", "Verdict", "logits_to_probs", "make_rule"]
