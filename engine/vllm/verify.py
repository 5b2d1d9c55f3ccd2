"""PCG over vLLM's flattened speculative layout, built on engine/ops/verify.py's plain tensor functions (the
group test and the residual draw our engine's PCG runs: one implementation for both engines).

vLLM's rejection sampler sees one step of B requests as
  draft_token_ids      Int32[N]        the drafts of every request, request after request (N = Σ n_b)
  num_draft_tokens     list[int] [B]   n_b, drafts of request b (may differ between requests, may be 0)
  cu_num_draft_tokens  Int32[B]        cumulative n_b
  draft_probs          Float[N, V]     p of each draft position (draft_sample_method="probabilistic")
  target_logits        Float[N, V]     the target's logits at the draft positions, after vLLM's penalties,
                                       allowed_token_ids, temperature, top-k and top-p
  bonus_token_ids      Int[B, 1]       a plain target sample after the last draft (vLLM's sampler drew it)
and returns Int32[B, max_spec_len + 1]: accepted drafts, then the recovered or bonus token, then
PLACEHOLDER_TOKEN_ID (-1). For the rows PCG serves, `FlatVerifier.sample` runs `group_test` over their N
flat positions at once, takes each row's accepted prefix, draws the group residual at each first rejection
(`residual_draw`, or `residual_thinning` for large tables, as PCGRule chooses) and keeps vLLM's bonus token
after a fully accepted row (PCG's bonus is a plain target sample, which vLLM's sampler already drew).

Uniforms: each row draws what our engine's PCG draws from one generator (VerifyUniforms.draw: its n_b
acceptance uniforms, then the emission's, then the in-group token's), from its request's generator when it
has a seed (vLLM's `sampling_metadata.generators`) and from the worker's otherwise; rows without a seed and
with the same n_b draw together. Rows vLLM keeps: greedy rows (temperature 0) and rows whose rule is `exact`
(vLLM's standard sampler, which is that rule); a step mixing both runs vLLM's sampler once and overwrites
the rows PCG serves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from pcgtts.engine.acceptance import RuleCache
from pcgtts.engine.acceptance.base import assemble, count_accepted
from pcgtts.engine.acceptance.pcg import PCGRule
from pcgtts.engine.acceptance.sampling import VerifyUniforms
from pcgtts.engine.ops.verify import group_test, residual_draw, residual_thinning
from pcgtts.engine.vllm.settings import STANDARD, VerifySettings

log = logging.getLogger("vllm.pcgtts")  # a child of vLLM's logger: its handlers, its format
PLACEHOLDER = -1  # vLLM's PLACEHOLDER_TOKEN_ID, and our Verdict's padding
RULES = (STANDARD, "pcg")  # what verifies inside vLLM: its own sampler, and PCG through this module


class FlatVerifier:
    """One per vLLM worker: the deployment's PCG rules (ASG tables loaded once, on the worker's device) and
    the generator of requests without a seed."""

    def __init__(self, settings: VerifySettings, device: torch.device | str):
        self.settings = settings
        self.device = torch.device(device)
        check_rule(settings.acceptance)
        self.rules = RuleCache(settings.acceptance, settings.acceptance_params, settings.table_files(),
                               self.device)
        self.generator = torch.Generator(device=self.device).manual_seed(settings.seed)
        # Per row of the coming step: (rule, ASG table) the request asked for (set by the model runner's
        # sampling step, plugin.py); None: every row takes the deployment's.
        self.row_choices: list[tuple[str | None, str | None]] | None = None
        if settings.acceptance != STANDARD:
            self.rules.get()  # loads the default table now (start-up), not in the first request

    def rule_for(self, choice: tuple[str | None, str | None]) -> PCGRule | None:
        """The PCG rule for a request's choice; None where vLLM's standard sampler (`exact`) serves it. A
        choice this worker cannot serve (the front end refuses those first: VllmEngine.validate) is not
        allowed to fail the step of every request: that row keeps vLLM's sampler, with a warning."""
        name, table = choice
        if (name or self.settings.acceptance) == STANDARD:
            return None
        try:
            self.check(name, table)
            return self.rules.get(name, table)
        except ValueError as exc:
            log.warning("pcgtts: %s; this request verifies with vLLM's standard sampler", exc)
            return None

    def check(self, acceptance: str | None, asg_table: str | None) -> None:
        """ValueError unless this worker could serve the choice (no I/O)."""
        check_rule(acceptance or self.settings.acceptance)
        if (acceptance or self.settings.acceptance) != STANDARD or asg_table is not None:
            self.rules.check(acceptance, asg_table)

    def sample(self, standard: Callable[..., torch.Tensor], draft_token_ids: torch.Tensor,
               num_draft_tokens: list[int], max_spec_len: int, cu_num_draft_tokens: torch.Tensor,
               draft_probs: torch.Tensor | None, target_logits: torch.Tensor, bonus_token_ids: torch.Tensor,
               sampling_metadata, *args, **kwargs) -> torch.Tensor:
        """vLLM's `rejection_sample` with PCG on the rows it serves; `standard` is vLLM's own."""
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
        starts = [c - n for c, n in zip(cu_num_draft_tokens.tolist(), num_draft_tokens, strict=True)]
        for rule in {id(r): r for r in rules if r is not None}.values():
            rows = [i for i in ours if rules[i] is rule]
            FlatRows(rule, rows, [starts[i] for i in rows], [num_draft_tokens[i] for i in rows],
                     [sampling_metadata.generators.get(i, self.generator) for i in rows]).verify(
                output, draft_token_ids, draft_probs, target_logits, bonus_token_ids)
        return output


def check_rule(name: str) -> None:
    if name not in RULES:
        raise ValueError(f"acceptance {name!r} does not run inside vLLM; choose one of {list(RULES)} "
                         "(the other rules run on the built-in engine)")


class FlatRows:
    """The rows of one step that one PCG rule verifies: request rows, their first flat positions, draft
    counts and generators."""

    def __init__(self, rule: PCGRule, rows: list[int], starts: list[int], counts: list[int],
                 generators: list[torch.Generator]):
        self.rule, self.rows, self.starts, self.counts = rule, rows, starts, counts
        self.generators = generators

    def uniforms(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(accept Float64[Σ n], emit Float64[R], token Float64[R] or None), each row's drawn as our engine's
        PCG draws them from one generator; rows sharing a generator and n draw together, in row order."""
        in_group = self.rule.residual == "enumerate"
        r = len(self.rows)
        accept = torch.empty(sum(self.counts), dtype=torch.float64, device=device)
        emit = torch.empty(r, dtype=torch.float64, device=device)
        token = torch.empty(r, dtype=torch.float64, device=device) if in_group else None
        offsets = torch.tensor([0, *self.counts], device=device).cumsum(0)[:-1]
        together: dict[tuple[int, int], list[int]] = {}
        for k, (gen, n) in enumerate(zip(self.generators, self.counts, strict=True)):
            together.setdefault((id(gen), n), []).append(k)
        for (_, n), ks in together.items():
            if n == 0:  # no drafts, no draws (as vLLM does for such rows)
                continue
            u = VerifyUniforms.draw(self.generators[ks[0]], len(ks), n, device, in_group)
            k_t = torch.tensor(ks, device=device)
            accept[(offsets[k_t, None] + torch.arange(n, device=device)).flatten()] = u.accept.flatten()
            emit[k_t] = u.emit
            if in_group:
                token[k_t] = u.token
        return accept, emit, token

    def verify(self, output, draft_token_ids, draft_probs, target_logits, bonus_token_ids) -> None:
        """Writes the rows' verdicts into output [B, max_spec_len + 1]."""
        device = target_logits.device
        rule = self.rule
        layout = rule.layout  # on the worker's device: RuleCache loaded the table there
        counts = torch.tensor(self.counts, device=device)  # [R]
        g = int(counts.max())
        row_t = torch.tensor(self.rows, device=device)
        bonus = bonus_token_ids.view(-1)[row_t].long()  # [R]
        if g == 0:  # no drafts this step: the bonus tokens alone, as vLLM's sampler does
            output[row_t, 0] = bonus.to(output.dtype)
            return
        if draft_probs is None:
            raise RuntimeError("PCG needs the draft's distributions: run vLLM's draft model with "
                               "speculative_config draft_sample_method='probabilistic'")
        u_accept, u_emit, u_token = self.uniforms(device)
        # every flat position of these rows, row after row: [N_r]
        positions = torch.cat([torch.arange(s, s + n, device=device)
                               for s, n in zip(self.starts, self.counts, strict=True)])
        x = draft_token_ids.long()[positions]  # [N_r]
        p = draft_probs.index_select(0, positions).float()  # [N_r, V]
        q = target_logits.index_select(0, positions).softmax(dim=-1, dtype=torch.float32)  # [N_r, V]
        _, accepted = group_test(layout, x, u_accept, p, q)  # [N_r]
        # the same positions padded to [R, γ] (short rows: False beyond their drafts)
        cols = torch.arange(g, device=device)
        valid = cols[None, :] < counts[:, None]  # [R, γ]
        first = counts.cumsum(0) - counts  # [R] each row's first index into the N_r positions
        at = (first[:, None] + cols[None, :]).clamp(max=positions.numel() - 1)  # [R, γ]
        num_accepted = count_accepted(accepted[at] & valid)  # [R]
        drafts = torch.where(valid, x[at], PLACEHOLDER)  # [R, γ]
        last = bonus.clone()  # fully accepted rows keep vLLM's bonus token
        rejected = torch.nonzero(num_accepted < counts).flatten()
        if rejected.numel():
            emit = first[rejected] + num_accepted[rejected]  # [R_rej] into the N_r positions
            p_e, q_e = p.index_select(0, emit), q.index_select(0, emit)  # [R_rej, V]
            if rule.residual == "enumerate":
                last[rejected] = residual_draw(layout, q_e - p_e, q_e, u_emit[rejected], u_token[rejected])[0]
            else:
                last[rejected] = self._thinning(layout, rejected, p_e, q_e)
        tokens = assemble(drafts.clamp(min=0), num_accepted, last).tokens  # [R, γ+1], -1 after the last
        output[row_t, :g + 1] = tokens.to(output.dtype)

    def _thinning(self, layout, rejected: torch.Tensor, p_e: torch.Tensor, q_e: torch.Tensor) -> torch.Tensor:
        """Thinning's draws depend on the data, so rows sharing a generator draw in one call."""
        rule = self.rule
        tokens = torch.empty(rejected.numel(), dtype=torch.long, device=q_e.device)
        by_gen: dict[int, list[int]] = {}
        for j, k in enumerate(rejected.tolist()):
            by_gen.setdefault(id(self.generators[k]), []).append(j)
        for js in by_gen.values():
            j_t = torch.tensor(js, device=q_e.device)
            gen = self.generators[int(rejected[js[0]])]
            tokens[j_t] = residual_thinning(layout, p_e[j_t], q_e[j_t], gen, rule.thinning_trials,
                                            rule.thinning_rounds)[0]
        return tokens
