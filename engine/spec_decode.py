"""One decoding step for a batch of running sequences: speculative (draft + verify) or target-only.

The draft is either a small Llama with its own paged KV cache (`draft`, a ModelRunner) or a feature head
(`head`, engine/model/feature_head.py) that chains on the target's last hidden state and keeps no cache.

Cache invariant between steps: the target holds K/V of all tokens but the last; a Llama draft holds at least
all but the last two (one behind after a fully accepted round, whose last draft token it never fed); a
feature head's row holds the target's hidden state at position n-2 (`Sequence.draft_state`, which produced
the last token), kept from the previous step's target forward.

A speculative step for B sequences of lengths n_b:
 1. draft, up to γ proposals (fewer where the draft is unsure, with EngineConfig.draft_confidence:
    engine/draft_length.py): a Llama draft first feeds the 1-2 tokens it has not cached yet, then each new
    draft token; a feature head steps from the kept state with the last token, then with each draft token, and
    scores through the target's LM head. Every proposal keeps its full processed distribution p
    (Float[B, γ, V]) and samples x ~ p;
 2. target, one forward over [last token, x_1..x_γ] at positions n_b-1 .. n_b+γ-1 -> q (Float[B, γ+1, V]);
    a row verifying fewer drafts than the longest row pads the rest, whose products the forward skips;
 3. the acceptance rule decides; emitted = accepted drafts + one recovered/bonus token;
 4. both caches are rolled back to the positions whose tokens survived (a head row keeps the target's state
    at the last surviving position).
γ = 0 (or no draft) scores only the last token with the target and samples from q. A head row without a
state for its current length (its first step after the prompt) takes a target-only step, which keeps one.
Notation as in the PCG paper (and engine.acceptance): p is the draft's distribution, q the target's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pcgtts.engine.acceptance import AcceptanceRule
from pcgtts.engine.acceptance.sampling import RowGenerators
from pcgtts.engine.batch_invariance import PLAIN, InvariancePlan
from pcgtts.engine.draft_length import confident_lengths, still_drafting
from pcgtts.engine.model.feature_head import FeatureHead
from pcgtts.engine.model_runner import ModelRunner
from pcgtts.engine.ops import Ops
from pcgtts.engine.sampling import BatchSampler
from pcgtts.engine.sequence import Sequence


@dataclass
class StepResult:
    tokens: list[list[int]]  # per sequence: tokens emitted this step (accepted drafts + one more)
    num_accepted: list[int]  # per sequence, in [0, its γ]
    num_drafted: list[int]  # per sequence: drafts verified (its own γ; 0 target-only)


class SpeculativeDecoder:
    def __init__(self, target: ModelRunner, draft: ModelRunner | None, num_speculative_tokens: int,
                 shared_generator: torch.Generator, head: FeatureHead | None, ops: Ops,
                 plan: InvariancePlan = PLAIN, invariant_steps: str = "off", draft_confidence: float = 0.0):
        """draft or head (at most one) proposes; each sequence brings the acceptance rule that verifies its
        drafts (`Sequence.rule`). draft_confidence: θ of engine/draft_length.py (0: each row drafts its γ).
        ops: the forms of the per-step operations (the engine's, engine/ops);
        plan: the padding that makes forwards batch-invariant; invariant_steps: which forwards take it,
        "seeded" (prefills, and steps holding a seeded or greedy request), "always" or "off"
        (EngineConfig.deterministic)."""
        if draft is not None and head is not None:
            raise ValueError("one draft: a Llama draft or a feature head, not both")
        self.target = target
        self.draft = draft if num_speculative_tokens > 0 else None
        self.head = head if num_speculative_tokens > 0 else None
        has_draft = self.draft is not None or self.head is not None
        self.num_speculative_tokens = num_speculative_tokens if has_draft else 0
        self.shared_generator = shared_generator
        self.vocab_size = target.model.cfg.vocab_size
        self.device = target.device
        self.ops = ops
        self.draft_confidence = float(draft_confidence)
        self._valid: dict[tuple[int, int], torch.Tensor] = {}
        self.plan, self.invariant_steps = plan, invariant_steps
        self._shaped: InvariancePlan | None = None  # the plan the models' forwards take now
        self._shape(PLAIN)

    def _shape(self, plan: InvariancePlan) -> None:
        """Give every model's forwards `plan` (a no-op when they have it already)."""
        if plan is not self._shaped:
            for part in (self.target, self.draft, self.head):
                if part is not None:
                    part.apply_plan(plan)
            self._shaped = plan

    def _plan_for(self, seqs: list[Sequence] | None) -> InvariancePlan:
        """The plan of a decoding step over `seqs` (None: a prefill, whose K/V later steps and other
        requests, through the prefix cache, may read)."""
        if self.invariant_steps == "always" or (self.invariant_steps == "seeded" and (
                seqs is None or any(s.params.reproducible for s in seqs))):
            return self.plan
        return PLAIN

    # ---- prefill ----------------------------------------------------------------------------------------
    def prefill(self, items: list[tuple[Sequence, int]]) -> None:
        """Cache K/V of the next `n` uncached tokens of each sequence, in both models (no sampling)."""
        if not items:
            return
        self._shape(self._plan_for(None))
        ends = [seq.target.num_computed + n for seq, n in items]  # the draft catches up to the same end
        runners = [(self.target, lambda s: s.target)]
        if self.draft is not None:
            runners.append((self.draft, lambda s: s.draft))
        for runner, state in runners:
            states, chunks = [], []
            for (seq, _), end in zip(items, ends, strict=True):
                st = state(seq)
                if end > st.num_computed:
                    states.append(st)
                    chunks.append(seq.token_ids[st.num_computed:end])
            if states:
                runner.forward_chunks(states, chunks)

    # ---- decode -----------------------------------------------------------------------------------------
    def step(self, seqs: list[Sequence], gamma: int | None = None) -> StepResult:
        """One decoding step drafting γ tokens per row (at most the decoder's; None: the decoder's γ; a row's
        own γ may be lower); γ = 0 decodes with the target alone this step (the draft catches up next
        time). A row's generator gives γ draws to the draft per step, so a seeded row's tokens depend on the
        γ of the steps it runs in."""
        gamma = self.num_speculative_tokens if gamma is None else min(gamma, self.num_speculative_tokens)
        if gamma and self.head is not None:
            ready = [s.draft_state_at == s.length for s in seqs]
            if not all(ready):
                return self._split_step(seqs, ready, gamma) if any(ready) else self.step(seqs, 0)
        self._shape(self._plan_for(seqs))
        sampler = BatchSampler(seqs, self.vocab_size, self.device, self.shared_generator, self.ops)
        if gamma == 0:
            return self._target_only(seqs, sampler)
        return self._speculate(seqs, sampler, gamma)

    def _split_step(self, seqs: list[Sequence], ready: list[bool], gamma: int) -> StepResult:
        """Rows with a head state speculate; the others take a target-only step, which gives them one."""
        parts = {flag: [i for i, r in enumerate(ready) if r == flag] for flag in (True, False)}
        n = len(seqs)
        merged = StepResult(tokens=[[]] * n, num_accepted=[0] * n, num_drafted=[0] * n)
        for flag, rows in parts.items():
            result = self.step([seqs[i] for i in rows], gamma if flag else 0)
            for i, tokens, k, d in zip(rows, result.tokens, result.num_accepted, result.num_drafted,
                                       strict=True):
                merged.tokens[i], merged.num_accepted[i], merged.num_drafted[i] = tokens, k, d
        return merged

    def _target_only(self, seqs: list[Sequence], sampler: BatchSampler) -> StepResult:
        hidden = self.target.forward_chunks([s.target for s in seqs], [s.token_ids[-1:] for s in seqs])
        tokens = sampler.probs_and_draw(self.target.logits(hidden))[1].tolist()
        if self.head is not None:  # the state at n-1, which produced the token sampled now (a copy)
            self._keep_states(seqs, hidden[:, -1].clone(), [0] * len(seqs))
        zeros = [0] * len(seqs)
        return StepResult(tokens=[[t] for t in tokens], num_accepted=zeros, num_drafted=zeros)

    @staticmethod
    def _keep_states(seqs: list[Sequence], states: torch.Tensor, num_accepted: list[int]) -> None:
        """A head row's next state: states[b] (the target's hidden state at the position that produced the
        row's last emitted token, [B, d]; a tensor of its own, not a view of a buffer that captured graphs
        reuse), valid once the row holds its k + 1 emitted tokens."""
        for b, (s, k) in enumerate(zip(seqs, num_accepted, strict=True)):
            s.draft_state, s.draft_state_at = states[b], s.length + k + 1

    def _speculate(self, seqs: list[Sequence], sampler: BatchSampler, g: int) -> StepResult:
        dev = self.device
        b = len(seqs)
        lengths = [s.length for s in seqs]
        caps = [min(g, s.params.num_speculative_tokens or g) for s in seqs]  # each row's own γ
        # What the target scores: [last token, x_1..x_γ] at positions n_b-1 .. n_b+γ-1; the draft writes its
        # proposals straight into `ids` and reads its inputs from it (column j is the draft's j-th input).
        ids = torch.tensor([[s.token_ids[-1]] + [0] * g for s in seqs], device=dev)  # [B, γ+1]
        positions = torch.tensor([range(n - 1, n + g) for n in lengths], device=dev)  # [B, γ+1]
        drafts = ids[:, 1:]  # [B, γ] x_1..x_γ (a view)
        draft_probs = torch.empty(b, g, self.vocab_size, device=dev)  # p_1..p_γ
        confidence = torch.empty(b, g, device=dev)  # max_t p_j(t)

        # 1. draft up to γ proposals per row (draft_length.py: fewer where the draft is unsure)
        propose = self._propose_with_head if self.head is not None else self._propose_with_draft
        made = propose(seqs, sampler, ids, positions, drafts, draft_probs, confidence, caps, g)
        for _ in range(g - made):  # a row's generator gives γ draws per step however many proposals are made,
            sampler.uniforms()  # so what a seeded row draws next does not depend on its batch mates
        row_gammas = caps if not self.draft_confidence else confident_lengths(
            confidence[:, :made], torch.tensor(caps, device=dev), self.draft_confidence).tolist()
        # The target scores only as many drafts as the longest row verifies (every count runs eagerly; with
        # captured graphs, which hold γ+1 tokens per row, it scores all γ and ignores the rest).
        if self.target.captured is None:
            g = max(row_gammas)
            ids, positions, drafts, draft_probs = ids[:, :g + 1], positions[:, :g + 1], drafts[:, :g], \
                draft_probs[:, :g]

        # 2. target scores the last token and the drafts in one forward.
        t_states = [s.target for s in seqs]
        t_tables = self.target.block_tables(t_states, max(lengths) + g)
        # each row scores its own drafts only: a row verifying γ_i < g drafts pads the rest (the forward skips
        # padding tokens' products; their hidden states are zeros, never read)
        valid = self._all_valid(b, g + 1) if min(row_gammas) == g else \
            torch.arange(g + 1, device=dev)[None, :] <= torch.tensor(row_gammas, device=dev)[:, None]
        hidden = self.target.forward(ids, positions, valid, t_tables, states=t_states)
        target_probs = sampler.probs(self.target.logits(hidden), drafts, offset=0)  # [B, g+1, V]

        # 3. verify (each row up to its own length), 4. roll back.
        tokens, accepted = self._verify(seqs, row_gammas, sampler, drafts, draft_probs, target_probs)
        emitted = [row[:k + 1] for row, k in zip(tokens.tolist(), accepted.tolist(), strict=True)]
        num_accepted = [len(e) - 1 for e in emitted]
        if self.head is not None:  # the state at n-1+k, which produced the row's last emitted token (the
            # advanced index gathers a copy)
            self._keep_states(seqs, hidden[torch.arange(b, device=dev), accepted], num_accepted)
        for s, k in zip(seqs, num_accepted, strict=True):
            s.target.num_computed = s.length + g
            s.target.roll_back(self.target.blocks, s.length + k)
            if self.draft is not None:
                s.draft.roll_back(self.draft.blocks, s.length + k)
        return StepResult(tokens=emitted, num_accepted=num_accepted, num_drafted=row_gammas)

    def _draw_draft(self, sampler: BatchSampler, logits: torch.Tensor, j: int, drafts: torch.Tensor,
                    draft_probs: torch.Tensor, confidence: torch.Tensor, caps: list[int]) -> bool:
        """Draw proposal j of every row from the draft's logits ([B, 1, V]) into drafts / draft_probs /
        confidence (the top probability of p_j); whether the draft goes on to proposal j+1. Without a
        confidence threshold that is decided by the rows' γ alone, on the host (no device sync per
        proposal)."""
        drafts[:, j] = sampler.probs_and_draw(logits, drafts[:, :j], offset=j, out=draft_probs[:, j])[1]
        if self.draft_confidence:  # max_t p_j(t), whether x_j is verified: a function of x_1..x_{j-1} only
            confidence[:, j] = draft_probs[:, j].amax(dim=1)
        if j + 1 >= max(caps):
            return False
        if not self.draft_confidence:
            return True
        return still_drafting(confidence[:, :j + 1], torch.tensor(caps, device=confidence.device),
                              self.draft_confidence)

    def _propose_with_head(self, seqs: list[Sequence], sampler: BatchSampler, ids: torch.Tensor,
                           positions: torch.Tensor, drafts: torch.Tensor, draft_probs: torch.Tensor,
                           confidence: torch.Tensor, caps: list[int], g: int) -> int:
        """The feature head from each row's kept state: input j is ids[:, j] (the last token, then drafts),
        up to g proposals. Returns the proposals made per row (the rest of the buffers stay unwritten)."""
        states = torch.stack([s.draft_state for s in seqs])  # [B, d]
        for j in range(g):
            states = self.head(states, ids[:, j])
            logits = self.target.logits(states[:, None])  # [B, 1, V]
            if not self._draw_draft(sampler, logits, j, drafts, draft_probs, confidence, caps):
                return j + 1
        return g

    def _propose_with_draft(self, seqs: list[Sequence], sampler: BatchSampler, ids: torch.Tensor,
                            positions: torch.Tensor, drafts: torch.Tensor, draft_probs: torch.Tensor,
                            confidence: torch.Tensor, caps: list[int], g: int) -> int:
        """The Llama draft: catch up on uncached tokens (the last one, or the last two after a fully accepted
        round), then one forward per proposed token, up to g. Returns the proposals made per row."""
        b = len(seqs)
        lengths = [s.length for s in seqs]
        one_each = self._all_valid(b, 1)
        states = [s.draft for s in seqs]
        tables = self.draft.block_tables(states, max(lengths) + g - 1)
        metas = self.draft.column_metas(positions[:, :g], tables) or [None] * g
        if all(st.num_computed == n - 1 for st, n in zip(states, lengths, strict=True)):
            hidden = self.draft.forward(ids[:, :1], positions[:, :1], one_each, tables, meta=metas[0],
                                        states=states)
        else:
            hidden = self.draft.forward_chunks(states, [s.token_ids[s.draft.num_computed:] for s in seqs])
        logits = self.draft.logits(hidden[:, -1:])  # [B, 1, V]
        made = g
        for j in range(g):
            if j > 0:
                hidden = self.draft.forward(ids[:, j:j + 1], positions[:, j:j + 1], one_each, tables,
                                            meta=metas[j], states=states)
                logits = self.draft.logits(hidden)
            if not self._draw_draft(sampler, logits, j, drafts, draft_probs, confidence, caps):
                made = j + 1
                break
        for s in seqs:  # it has fed the last token and the drafts before the last one
            s.draft.num_computed = s.length + made - 1
        return made

    def _all_valid(self, rows: int, tokens: int) -> torch.Tensor:
        """Bool[rows, tokens] of True (read-only; one per shape, made once)."""
        key = (rows, tokens)
        if key not in self._valid:
            self._valid[key] = torch.ones(rows, tokens, dtype=torch.bool, device=self.device)
        return self._valid[key]

    @staticmethod
    def _verify_generator(generator: torch.Generator) -> torch.Generator:
        """A fresh generator seeded by one draw of `generator`: each rule consumes randomness in its own
        way, and this keeps that from shifting the draft's later draws (seeded outputs then depend on
        the rule only through its verdicts; PCG with singleton groups replays `exact` exactly)."""
        seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
        return torch.Generator(device=generator.device).manual_seed(seed)

    def _verify(self, seqs, row_gammas, sampler, drafts, draft_probs, target_probs):
        """Run each row's acceptance rule, up to its own length γ_i (drafts: [B, g] with g ≥ every γ_i),
        with the row's generator; rows sharing rule and γ
        share one call (rules with `row_draws` take their rows' generators together, others one call per
        generator). A row with γ_i < γ is verified on its first γ_i drafts, and q at position γ_i is its
        bonus distribution, so it decodes exactly as an engine run at γ_i would in distribution."""
        g = drafts.shape[1]
        rules: dict[int, AcceptanceRule] = {}
        groups: dict[tuple[int, int, int], list[int]] = {}
        for i, (s, row_gamma, gen) in enumerate(zip(seqs, row_gammas, sampler.generators, strict=True)):
            rule = s.rule
            rules[id(rule)] = rule
            groups.setdefault((id(rule), row_gamma, id(gen)), []).append(i)
        # one verify generator per (rule, γ, generator) group, seeded in the groups' order
        verify_gens = {key: self._verify_generator(sampler.generators[rows[0]])
                       for key, rows in groups.items()}
        if len(groups) == 1 and next(iter(groups))[1] == g:
            (key, rows), = groups.items()
            v = rules[key[0]].verify(drafts, draft_probs, target_probs, verify_gens[key])
            return v.tokens, v.num_accepted
        calls: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
        for key in groups:
            calls.setdefault(key[:2] if rules[key[0]].row_draws else key, []).append(key)
        tokens = torch.empty(len(seqs), g + 1, dtype=torch.long, device=self.device)
        accepted = torch.empty(len(seqs), dtype=torch.long, device=self.device)
        for (rule_id, row_gamma, *_), keys in calls.items():
            rows = sorted(i for key in keys for i in groups[key])
            idx = torch.tensor(rows, device=self.device)
            if len(keys) == 1:
                generator = verify_gens[keys[0]]
            else:
                position = {row: n for n, row in enumerate(rows)}
                generator = RowGenerators([(verify_gens[key], torch.tensor([position[i] for i in groups[key]],
                                                                           device=self.device))
                                           for key in keys], len(rows))
            v = rules[rule_id].verify(drafts[idx, :row_gamma], draft_probs[idx, :row_gamma],
                                      target_probs[idx, :row_gamma + 1], generator)
            tokens[idx, :row_gamma + 1], accepted[idx] = v.tokens, v.num_accepted
        return tokens, accepted
