"""The acceptance rules one engine serves, by (rule name, ASG table name), each built once.

A request may name another rule than the engine's and another of its ASG tables (A/B tests); rules that
use a table (`uses_asg_table`) get the one the request names, loaded on first use and kept.
"""

from __future__ import annotations

from pathlib import Path

import torch
from pcgtts.engine.acceptance.base import AcceptanceRule
from pcgtts.engine.ops import Ops

# Parameters through which a group rule is given its groups directly instead of an ASG table file.
_OWN_GROUPS = ("table", "embeddings", "neighbours")


class RuleCache:
    def __init__(self, default: str, params: dict | None = None, tables: dict[str, Path] | None = None,
                 device: torch.device | str = "cpu", ops: Ops | None = None):
        """default: the rule of requests that name none; params: its extra parameters (only it gets them);
        tables: ASG table files by name, the default table first; ops: the forms of the per-step
        operations (engine/ops), handed to every rule with a compiled form."""
        self.default = default
        self.params = dict(params or {})
        self.tables = {name: Path(path) for name, path in (tables or {}).items()}
        self.device = torch.device(device)
        self.ops = ops
        self._loaded: dict[str, object] = {}  # ASG tables by name
        self._rules: dict[tuple[str, str | None], AcceptanceRule] = {}

    def _key(self, name: str | None, table: str | None) -> tuple[str, str | None]:
        """(rule, table) after defaults, with ValueError for an unknown rule or table. No I/O."""
        from pcgtts.engine.acceptance import uses_asg_table

        name = name or self.default
        if not uses_asg_table(name):
            return name, None
        if name == self.default and any(k in self.params for k in _OWN_GROUPS):
            if table is not None:
                raise ValueError(f"the {name!r} rule is configured with its own groups; no table choice")
            return name, None
        if not self.tables:
            raise ValueError(f"the {name!r} rule needs an ASG table (EngineConfig.asg_table)")
        table = table or next(iter(self.tables))
        self.check_table(table)
        return name, table

    def check_table(self, table: str) -> None:
        if table not in self.tables:
            raise ValueError(f"no ASG table named {table!r}; this engine has {sorted(self.tables)}")

    def check(self, name: str | None, table: str | None = None) -> None:
        """Raises ValueError if `get(name, table)` could not serve a rule (no I/O: safe from any thread)."""
        if table is not None:
            self.check_table(table)
        self._key(name, table)

    def get(self, name: str | None = None, table: str | None = None) -> AcceptanceRule:
        """The rule called `name` (None = the default) over the ASG table called `table` (None = the
        default; only rules that use a table take one)."""
        from pcgtts.engine.acceptance import make_rule, rule_class

        key = self._key(name, table)
        if key not in self._rules:
            rule, table = key
            params = dict(self.params) if rule == self.default else {}
            if table is not None:
                params["table"] = self._table(table)
            if rule_class(rule).has_compiled_form and self.ops is not None:
                params.setdefault("ops", self.ops)
            self._rules[key] = make_rule(rule, **params)
        return self._rules[key]

    def built(self) -> list[tuple[str, str | None]]:
        """(rule, table) pairs built so far."""
        return list(self._rules)

    def _table(self, name: str):
        if name not in self._loaded:
            from pcgtts.asg_tables import ASGTable  # only deployments using group rules need it

            self._loaded[name] = ASGTable.load(self.tables[name]).to(self.device)
        return self._loaded[name]
