"""What a deployment tells vLLM's worker processes about verification, carried as vLLM's
`additional_config["pcgtts"]` (a plain dict, so it crosses vLLM's process boundaries as vLLM's own config
does), and how a request picks its rule (`SamplingParams.extra_args["pcgtts"]`).

vLLM keeps `speculative_config.rejection_sample_method="standard"`: its draft model then keeps each
proposal's full distribution (`draft_sample_method="probabilistic"`), which our rules need, and `exact` *is*
vLLM's standard rejection sampler. PCG verifies through verify.py; the other rules
(block, pcg-block, ssd, topk, lantern) run on the built-in engine only."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

KEY = "pcgtts"  # in additional_config and in SamplingParams.extra_args
STANDARD = "exact"  # the rule vLLM's own rejection sampler implements


@dataclass
class VerifySettings:
    acceptance: str = STANDARD  # the deployment's rule (engine.acceptance.RULES)
    asg_table: str | None = None  # the default ASG table file (pcg, lantern)
    extra_asg_tables: dict[str, str] = field(default_factory=dict)  # more, by name, for per-request choice
    acceptance_params: dict = field(default_factory=dict)  # extra parameters of the default rule
    seed: int = 0  # seeds the worker's generator for requests without their own seed

    def to_additional_config(self) -> dict:
        return {KEY: asdict(self)}

    @classmethod
    def from_additional_config(cls, additional: dict | None) -> VerifySettings | None:
        spec = (additional or {}).get(KEY)
        return None if spec is None else cls(**spec)

    def table_files(self) -> dict[str, Path]:
        """ASG table files by name, the default first (its name is its file stem, as in our engine)."""
        tables = {Path(self.asg_table).stem: Path(self.asg_table)} if self.asg_table else {}
        return tables | {name: Path(path) for name, path in self.extra_asg_tables.items()}


def request_choice(extra_args: dict | None) -> tuple[str | None, str | None]:
    """(rule, ASG table name) a request asked for, None each for the deployment's."""
    spec = (extra_args or {}).get(KEY) or {}
    return spec.get("acceptance"), spec.get("asg_table")


def request_extra_args(acceptance: str | None, asg_table: str | None) -> dict | None:
    """SamplingParams.extra_args carrying a request's rule choice (None when it has none)."""
    spec = {k: v for k, v in (("acceptance", acceptance), ("asg_table", asg_table)) if v is not None}
    return {KEY: spec} if spec else None
