"""Our acceptance rules over vLLM's flattened speculative layout.

vLLM's rejection sampler sees one step of B requests as
  draft_token_ids      Int32[N]        the drafts of every request, request after request (N = Σ n_b)
  num_draft_tokens     list[int] [B]   n_b, drafts of request b (may differ between requests, may be 0)
  cu_num_draft_tokens  Int32[B]        cumulative n_b
  draft_probs          Float[N, V]     p of each draft position (draft_sample_method="probabilistic")
  target_logits        Float[N, V]     the target's logits at the draft positions, after vLLM's penalties,
                                       allowed_token_ids, temperature, top-k and top-p
  bonus_token_ids      Int[B, 1]       a plain target sample after the last draft (vLLM's sampler drew it)
and returns Int32[B, max_spec_len + 1]: accepted drafts, then the recovered or bonus token, then
PLACEHOLDER_TOKEN_ID (-1). `FlatVerifier.sample` regroups the rows its rules serve into our padded layout
([R, γ], [R, γ, V], [R, γ+1, V]) and runs `engine.spec_decode.verify_rows`, the batched verify of our own
engine, so the group test and residual are the same code (engine.acceptance) in both engines. The bonus
slot of each row holds a one-hot of vLLM's bonus token: our rules draw the bonus from q at that slot, which
then returns vLLM's draw, so the bonus stays vLLM's (its top-k/top-p sampler, its seeds).

Rows vLLM keeps: greedy rows (temperature 0) and rows whose rule is `exact` (vLLM's standard sampler, which
is that rule). A step mixing both runs vLLM's sampler once and overwrites our rows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from pcgtts.engine.acceptance import AcceptanceRule, RuleCache
from pcgtts.engine.spec_decode import verify_rows
from pcgtts.engine.vllm.settings import STANDARD, VerifySettings

log = logging.getLogger("vllm.pcgtts")  # a child of vLLM's logger: its handlers, its format
PLACEHOLDER = -1  # vLLM's PLACEHOLDER_TOKEN_ID, and our Verdict's padding


class FlatVerifier:
    """One per vLLM worker: the deployment's rules (ASG tables loaded once, on the worker's device) and the
    generator of requests without a seed."""

    def __init__(self, settings: VerifySettings, device: torch.device | str):
        self.settings = settings
        self.device = torch.device(device)
        self.rules = RuleCache(settings.acceptance, settings.acceptance_params, settings.table_files(),
                               self.device)
        self.generator = torch.Generator(device=self.device).manual_seed(settings.seed)
        # Per row of the coming step: (rule, ASG table) the request asked for (set by the model runner's
        # sampling step, plugin.py); None: every row takes the deployment's.
        self.row_choices: list[tuple[str | None, str | None]] | None = None
        if settings.acceptance != STANDARD:
            self.rules.get()  # loads the default table now (start-up), not in the first request

    def rule_for(self, choice: tuple[str | None, str | None]) -> AcceptanceRule | None:
        """Our rule for a request's choice; None where vLLM's standard sampler (`exact`) serves it."""
        name, table = choice
        if (name or self.settings.acceptance) == STANDARD:
            return None
        return self.rules.get(name, table)

    def check(self, acceptance: str | None, asg_table: str | None) -> None:
        """ValueError unless this worker could serve the choice (no I/O)."""
        if (acceptance or self.settings.acceptance) != STANDARD or asg_table is not None:
            self.rules.check(acceptance, asg_table)

    def sample(self, standard: Callable[..., torch.Tensor], draft_token_ids: torch.Tensor,
               num_draft_tokens: list[int], max_spec_len: int, cu_num_draft_tokens: torch.Tensor,
               draft_probs: torch.Tensor | None, target_logits: torch.Tensor, bonus_token_ids: torch.Tensor,
               sampling_metadata, *args, **kwargs) -> torch.Tensor:
        """vLLM's `rejection_sample` with our rules on the rows they serve; `standard` is vLLM's own."""
        def vllm_sampler() -> torch.Tensor:
            return standard(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                            target_logits, bonus_token_ids, sampling_metadata, *args, **kwargs)

        b = len(num_draft_tokens)
        choices, self.row_choices = self.row_choices, None
        if choices is None or len(choices) != b:
            choices = [(None, None)] * b
        if sampling_metadata.all_greedy or kwargs.get("synthetic_mode"):
            return vllm_sampler()
        greedy = [False] * b if sampling_metadata.all_random else \
            (sampling_metadata.temperature == 0).tolist()
        rules = [None if greedy[i] else self.rule_for(choices[i]) for i in range(b)]
        ours = [i for i in range(b) if rules[i] is not None]
        if not ours:
            return vllm_sampler()
        if len(ours) == b:
            output = torch.full((b, max_spec_len + 1), PLACEHOLDER, dtype=torch.int32,
                                device=target_logits.device)
        else:
            output = vllm_sampler()
            output[torch.tensor(ours, device=output.device)] = PLACEHOLDER
        generators = [sampling_metadata.generators.get(i, self.generator) for i in ours]
        self._verify_rows(output, ours, [rules[i] for i in ours], generators,
                          draft_token_ids, num_draft_tokens, cu_num_draft_tokens, draft_probs, target_logits,
                          bonus_token_ids)
        return output

    @staticmethod
    def _verify_rows(output, rows, rules, generators, draft_token_ids, num_draft_tokens, cu_num_draft_tokens,
                     draft_probs, target_logits, bonus_token_ids) -> None:
        """Writes rows' verdicts into output [B, max_spec_len + 1]."""
        device = target_logits.device
        counts = [num_draft_tokens[i] for i in rows]
        bonus = bonus_token_ids.view(-1)
        speculating = [k for k, n in enumerate(counts) if n > 0]
        idle = [rows[k] for k, n in enumerate(counts) if n == 0]
        if idle:  # no drafts this step: the bonus token alone, as vLLM's sampler does
            idle_t = torch.tensor(idle, device=device)
            output[idle_t, 0] = bonus[idle_t].to(output.dtype)
        if not speculating:
            return
        if draft_probs is None:
            raise RuntimeError("pcgtts' acceptance rules need the draft's distributions: run vLLM's "
                               "draft model with speculative_config draft_sample_method='probabilistic'")
        row_t = torch.tensor([rows[k] for k in speculating], device=device)  # [R]
        n = torch.tensor([counts[k] for k in speculating], device=device)  # [R]
        g = int(n.max())
        starts = cu_num_draft_tokens.long()[row_t] - n  # [R] first flat position of each row
        cols = torch.arange(g, device=device)
        flat = starts[:, None] + torch.minimum(cols[None, :], n[:, None] - 1)  # [R, γ] (short rows repeat)
        drafts = draft_token_ids.long()[flat]  # [R, γ]
        p = draft_probs[flat].float()  # [R, γ, V]
        target = torch.zeros(len(speculating), g + 1, target_logits.shape[-1], device=device)  # [R, γ+1, V]
        target[:, :g] = target_logits[flat].softmax(dim=-1, dtype=torch.float32)
        # the bonus slot (position n_r) of each row: vLLM's bonus token with probability one
        slot = target[torch.arange(len(speculating), device=device), n]  # [R, V] (a copy)
        slot.zero_().scatter_(1, bonus[row_t].long()[:, None], 1.0)
        target[torch.arange(len(speculating), device=device), n] = slot
        tokens, _ = verify_rows([rules[k] for k in speculating], [counts[k] for k in speculating],
                                [generators[k] for k in speculating], drafts, p, target)
        output[row_t, :g + 1] = tokens.to(output.dtype)
