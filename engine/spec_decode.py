"""One decoding step for a batch of running sequences: speculative (draft + verify) or target-only.

Cache invariant between steps: the target holds K/V of all tokens but the last; the draft holds at least
all but the last two (one behind after a fully accepted round, whose last draft token it never fed).

A speculative step for B sequences of lengths n_b:
 1. draft, γ forwards: first the 1-2 tokens it has not cached yet, then each new draft token; every
    proposal keeps its full processed distribution p (Float[B, γ, V]) and samples x ~ p;
 2. target, one forward over [last token, x_1..x_γ] at positions n_b-1 .. n_b+γ-1 -> q (Float[B, γ+1, V]);
 3. the acceptance rule decides; emitted = accepted drafts + one recovered/bonus token;
 4. both caches are rolled back to the positions whose tokens survived.
γ = 0 (or no draft) scores only the last token with the target and samples from q.
Notation as in the PCG paper (and engine.acceptance): p is the draft's distribution, q the target's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.acceptance import AcceptanceRule
from engine.acceptance.sampling import RowGenerators
from engine.model_runner import ModelRunner
from engine.sampling import BatchSampler
from engine.sequence import Sequence


@dataclass
class StepResult:
    tokens: list[list[int]]  # per sequence: tokens emitted this step (accepted drafts + one more)
    num_accepted: list[int]  # per sequence, in [0, its γ]
    num_drafted: list[int]  # per sequence: drafts verified (its own γ; 0 target-only)


class SpeculativeDecoder:
    def __init__(self, target: ModelRunner, draft: ModelRunner | None, gamma: int,
                 shared_generator: torch.Generator):
        """Each sequence brings the acceptance rule that verifies its drafts (`Sequence.rule`)."""
        self.target = target
        self.draft = draft if gamma > 0 else None
        self.gamma = gamma if draft is not None else 0
        self.shared_generator = shared_generator
        self.vocab_size = target.model.cfg.vocab_size
        self.device = target.device
        self._valid: dict[tuple[int, int], torch.Tensor] = {}

    # ---- prefill ----------------------------------------------------------------------------------------
    def prefill(self, items: list[tuple[Sequence, int]]) -> None:
        """Cache K/V of the next `n` uncached tokens of each sequence, in both models (no sampling)."""
        if not items:
            return
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
    def step(self, seqs: list[Sequence], speculate: bool = True) -> StepResult:
        """speculate=False decodes with the target alone this step (the draft catches up next time)."""
        sampler = BatchSampler(seqs, self.vocab_size, self.device, self.shared_generator)
        if self.gamma == 0 or not speculate:
            return self._target_only(seqs, sampler)
        return self._speculate(seqs, sampler)

    def _target_only(self, seqs: list[Sequence], sampler: BatchSampler) -> StepResult:
        hidden = self.target.forward_chunks([s.target for s in seqs], [s.token_ids[-1:] for s in seqs])
        probs = sampler.probs(self.target.logits(hidden))  # [B, 1, V]
        tokens = sampler.sample(probs[:, 0]).tolist()
        zeros = [0] * len(seqs)
        return StepResult(tokens=[[t] for t in tokens], num_accepted=zeros, num_drafted=zeros)

    def _speculate(self, seqs: list[Sequence], sampler: BatchSampler) -> StepResult:
        g, dev = self.gamma, self.device
        b = len(seqs)
        lengths = [s.length for s in seqs]
        # What the target scores: [last token, x_1..x_γ] at positions n_b-1 .. n_b+γ-1; the draft writes its
        # proposals straight into `ids` and reads its inputs from it (column j is the draft's j-th input).
        ids = torch.tensor([[s.token_ids[-1]] + [0] * g for s in seqs], device=dev)  # [B, γ+1]
        positions = torch.tensor([range(n - 1, n + g) for n in lengths], device=dev)  # [B, γ+1]
        drafts = ids[:, 1:]  # [B, γ] x_1..x_γ (a view)
        draft_probs = torch.empty(b, g, self.vocab_size, device=dev)  # p_1..p_γ
        one_each = self._all_valid(b, 1)

        # 1. draft: catch up on uncached tokens (the last one, or the last two after a fully accepted round),
        #    then one forward per proposed token.
        states = [s.draft for s in seqs]
        tables = self.draft.block_tables(states, max(lengths) + g - 1)
        metas = self.draft.column_metas(positions[:, :g], tables) or [None] * g
        if all(st.num_computed == n - 1 for st, n in zip(states, lengths, strict=True)):
            hidden = self.draft.forward(ids[:, :1], positions[:, :1], one_each, tables, meta=metas[0],
                                        states=states)
        else:
            hidden = self.draft.forward_chunks(states, [s.token_ids[s.draft.num_computed:] for s in seqs])
        logits = self.draft.logits(hidden[:, -1:])  # [B, 1, V]
        for j in range(g):
            if j > 0:
                hidden = self.draft.forward(ids[:, j:j + 1], positions[:, j:j + 1], one_each, tables,
                                            meta=metas[j], states=states)
                logits = self.draft.logits(hidden)
            p = sampler.probs(logits, drafts[:, :j], offset=j)[:, 0]  # [B, V]
            draft_probs[:, j] = p
            drafts[:, j] = sampler.sample(p)
        for s in seqs:
            s.draft.num_computed = s.length + g - 1

        # 2. target scores the last token and all γ drafts in one forward.
        t_states = [s.target for s in seqs]
        t_tables = self.target.block_tables(t_states, max(lengths) + g)
        hidden = self.target.forward(ids, positions, self._all_valid(b, g + 1), t_tables, states=t_states)
        target_probs = sampler.probs(self.target.logits(hidden), drafts, offset=0)  # [B, γ+1, V]

        # 3. verify (each row up to its own γ), 4. roll back.
        row_gammas = [min(g, s.params.num_speculative_tokens or g) for s in seqs]
        tokens, accepted = self._verify(seqs, row_gammas, sampler, drafts, draft_probs, target_probs)
        emitted = [row[:k + 1] for row, k in zip(tokens.tolist(), accepted.tolist(), strict=True)]
        num_accepted = [len(e) - 1 for e in emitted]
        for s, k in zip(seqs, num_accepted, strict=True):
            s.target.num_computed = s.length + g
            s.target.roll_back(self.target.blocks, s.length + k)
            s.draft.roll_back(self.draft.blocks, s.length + k)
        return StepResult(tokens=emitted, num_accepted=num_accepted, num_drafted=row_gammas)

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
        """Run each row's acceptance rule, up to its own γ, with the row's generator; rows sharing rule and γ
        share one call (rules with `row_draws` take their rows' generators together, others one call per
        generator). A row with γ_i < γ is verified on its first γ_i drafts, and q at position γ_i is its
        bonus distribution, so it decodes exactly as an engine run at γ_i would in distribution."""
        g = self.gamma
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
