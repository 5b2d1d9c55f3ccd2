"""Acceptance rules of speculative decoding: the only place acceptance math lives.

    rule = make_rule("exact")   # or "pcg" (table=), "ssd" (bias=), "topk" (k=), "lantern" (k=, delta=, ...),
                                # "block" (block verification), "pcg-block" (table=; its group-level form)
    verdict = rule.verify(draft_tokens, draft_probs, target_probs, generator)

`uses_asg_table(name)` says which rules work over an ASG table's groups; `RuleCache` (cache.py) builds each
(rule, table) pair a deployment serves once, loading tables on first use.

Both probability tensors must come from `logits_to_probs` with the same sampling parameters (warp.py).
"""

from __future__ import annotations

import importlib

from pcgtts.engine.acceptance.base import AcceptanceRule
from pcgtts.engine.acceptance.verdict import Verdict
from pcgtts.engine.acceptance.warp import logits_to_probs

# name -> "module:Class"; constructors take the rule's keyword parameters.
RULES = {
    "exact": "pcgtts.engine.acceptance.exact:ExactRule",
    "pcg": "pcgtts.engine.acceptance.pcg:PCGRule",
    "ssd": "pcgtts.engine.acceptance.ssd:SSDRule",
    "topk": "pcgtts.engine.acceptance.topk:TopKRule",
    "lantern": "pcgtts.engine.acceptance.lantern:LanternRule",
    "block": "pcgtts.engine.acceptance.block:BlockRule",
    "pcg-block": "pcgtts.engine.acceptance.pcg_block:PCGBlockRule",
}


def rule_class(name: str) -> type[AcceptanceRule]:
    if name not in RULES:
        raise ValueError(f"unknown acceptance rule {name!r}; choose from {sorted(RULES)}")
    module, cls = RULES[name].split(":")
    return getattr(importlib.import_module(module), cls)


def make_rule(name: str, **params) -> AcceptanceRule:
    """An acceptance rule by name; see RULES and each class for its parameters."""
    return rule_class(name)(**params)


def uses_asg_table(name: str) -> bool:
    """Whether the rule called `name` works over an ASG table's groups (pcg, pcg-block, lantern)."""
    return rule_class(name).uses_asg_table


from pcgtts.engine.acceptance.cache import RuleCache  # noqa: E402 (it builds rules with make_rule)

__all__ = ["RULES", "AcceptanceRule", "RuleCache", "Verdict", "logits_to_probs", "make_rule", "rule_class",
           "uses_asg_table"]
