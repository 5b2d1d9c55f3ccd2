"""Block verification (`block`) and its group-level form (`pcg-block`): the joint laws of a whole block,
and more accepted drafts than the token-level rules on the same inputs.

The models are toys whose next-token laws depend on the whole prefix (one Dirichlet draw per prefix), so a
block's positions are not exchangeable. A verdict emits τ+1 tokens of a block; the test completes every
row to a fixed length by sampling the *target* law after what was emitted, and that completed sequence must
follow the target's joint law (the losslessness of a verification: its output, continued by the target,
is the target)."""

from __future__ import annotations

import itertools

import pytest
import torch
from acceptance_support import Z_MAX, chi2_pvalue, perturbed, random_dist, z_score
from pcgtts.asg_tables import ASGTable
from pcgtts.engine.acceptance import make_rule
from pcgtts.engine.ops import TORCH_OPS, Ops

GAMMA = 3
ALPHA = 1e-3  # the chi-square tests pass at p > 0.001
# the rules' compiled CPU loops (the default on CPU) and their torch ops (what CUDA runs)
PATHS = pytest.mark.parametrize("ops", [Ops(compiled=True), TORCH_OPS], ids=["compiled", "torch-ops"])


class PrefixModels:
    """A draft p and a target q over `vocab` tokens, their laws looked up by the prefix's code:
    code(()) = 0, code(s + (x,)) = vocab·code(s) + x + 1 (prefixes up to GAMMA + 1 tokens).
    closeness: the draft is closeness·q + (1 - closeness)·(an independent law), per prefix."""

    def __init__(self, vocab: int, seed: int, closeness: float = 0.5, concentration: float = 0.7):
        n = sum(vocab ** k for k in range(GAMMA + 2))
        self.vocab = vocab
        self.target = torch.stack([random_dist(vocab, seed + 2 * i, concentration) for i in range(n)])
        other = torch.stack([random_dist(vocab, seed + 2 * i + 1, concentration) for i in range(n)])
        self.draft = closeness * self.target + (1 - closeness) * other  # [n, V] float64

    def child(self, code: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        return code * self.vocab + token + 1

    def block(self, rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """GAMMA drafts sampled from p, one after another -> (drafts Long[R, γ], p Float[R, γ, V] at each
        draft position, q Float[R, γ+1, V] at each draft position and after the last)."""
        gen = torch.Generator().manual_seed(seed)
        code = torch.zeros(rows, dtype=torch.long)
        drafts, codes = [], [code]
        for _ in range(GAMMA):
            x = torch.multinomial(self.draft[code], 1, generator=gen).squeeze(1)
            drafts.append(x)
            code = self.child(code, x)
            codes.append(code)
        codes = torch.stack(codes, 1)  # [R, γ+1]
        return torch.stack(drafts, 1), self.draft[codes[:, :GAMMA]].float(), self.target[codes].float()

    def target_joint(self, length: int) -> torch.Tensor:
        """Pr(x_0..x_{length-1}) under q, indexed by Σ_j x_j V^(length-1-j): [V^length] float64."""
        out = torch.ones(1, dtype=torch.float64)
        codes = torch.zeros(1, dtype=torch.long)
        for _ in range(length):
            out = (out[:, None] * self.target[codes]).flatten()
            codes = self.child(codes[:, None], torch.arange(self.vocab)[None, :]).flatten()
        return out


def complete_with_target(models: PrefixModels, tokens: torch.Tensor, emitted: torch.Tensor, length: int,
                         seed: int) -> torch.Tensor:
    """The emitted prefix of each row (tokens Long[R, ≥ emitted], emitted Long[R]), continued by sampling q up
    to `length` tokens -> the sequences' indices, Long[R] (as in target_joint)."""
    gen = torch.Generator().manual_seed(seed)
    rows = tokens.shape[0]
    code, index = torch.zeros(rows, dtype=torch.long), torch.zeros(rows, dtype=torch.long)
    for j in range(length):
        fresh = torch.multinomial(models.target[code], 1, generator=gen).squeeze(1)
        x = torch.where(j < emitted, tokens[:, min(j, tokens.shape[1] - 1)], fresh)
        code, index = models.child(code, x), index * models.vocab + x
    return index


def verify(rule, drafts, draft_probs, target_probs, seed):
    return rule.verify(drafts, draft_probs, target_probs, torch.Generator().manual_seed(seed))


def z_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """(mean a - mean b) / its standard error, for two samples."""
    a, b = a.double(), b.double()
    return float((a.mean() - b.mean()) / torch.sqrt(a.var() / a.numel() + b.var() / b.numel()))


# ---- block -------------------------------------------------------------------------------------------------
@PATHS
@pytest.mark.parametrize("closeness", [0.3, 0.8])
def test_block_completed_by_the_target_follows_the_target_joint(closeness, ops):
    """V=3, γ=3: the 81 sequences of γ+1 tokens (the bonus slot included), 60,000 blocks."""
    models, rows = PrefixModels(3, seed=10, closeness=closeness), 60_000
    drafts, draft_probs, target_probs = models.block(rows, seed=1)
    verdict = verify(make_rule("block", ops=ops), drafts, draft_probs, target_probs, seed=2)
    sequences = complete_with_target(models, verdict.tokens, verdict.num_emitted, GAMMA + 1, seed=3)
    joint = models.target_joint(GAMMA + 1)
    assert chi2_pvalue(sequences, joint) > ALPHA
    assert chi2_pvalue(sequences, perturbed(joint)) < 1e-9  # power against a 1% error
    # the drafts themselves (the draft's law) are told apart from the target's
    drafts_completed = complete_with_target(models, drafts, torch.full((rows,), GAMMA), GAMMA + 1, seed=3)
    assert chi2_pvalue(drafts_completed, joint) < 1e-9
    assert set(verdict.num_accepted.unique().tolist()) == set(range(GAMMA + 1))


def token_level_expected_accepted(models: PrefixModels) -> float:
    """E[accepted] of token-level verification: Σ_k Pr(the first k drafts pass) = Σ_k Σ_{x^k} Π_j
    min(p_j(x_j), q_j(x_j)), enumerated."""
    total = 0.0
    for k in range(1, GAMMA + 1):
        for prefix in itertools.product(range(models.vocab), repeat=k):
            code, mass = 0, 1.0
            for x in prefix:
                mass *= float(min(models.draft[code, x], models.target[code, x]))
                code = code * models.vocab + x + 1
            total += mass
    return total


@PATHS
@pytest.mark.parametrize("closeness", [0.3, 0.8])
def test_block_accepts_at_least_as_many_as_exact_on_the_same_blocks(closeness, ops):
    models, rows = PrefixModels(3, seed=20, closeness=closeness), 100_000
    drafts, draft_probs, target_probs = models.block(rows, seed=4)
    block = verify(make_rule("block", ops=ops), drafts, draft_probs, target_probs, seed=5).num_accepted
    exact = verify(make_rule("exact"), drafts, draft_probs, target_probs, seed=5).num_accepted
    assert abs(z_score(exact, token_level_expected_accepted(models))) < Z_MAX  # exact as its closed form
    assert z_difference(block, exact) > -Z_MAX


def test_block_accepts_strictly_more_where_the_ratio_alternates():
    """The paper's kind of case: p = (1/3, 2/3), q = (2/3, 1/3) at every position. Token-level accepts each
    draft with probability 2/3 overall; a block whose first ratio is 2 (x=0) carries that credit to a
    later ratio of 1/2 (x=1), which token-level rejects half of the time."""
    p, q, rows = torch.tensor([1 / 3, 2 / 3]), torch.tensor([2 / 3, 1 / 3], dtype=torch.float64), 100_000
    draft_probs, target_probs = p.expand(rows, GAMMA, 2), q.float().expand(rows, GAMMA + 1, 2)
    drafts = torch.multinomial(draft_probs.reshape(-1, 2), 1, replacement=True,
                               generator=torch.Generator().manual_seed(6)).view(rows, GAMMA)
    block = verify(make_rule("block"), drafts, draft_probs, target_probs, seed=7)
    exact = verify(make_rule("exact"), drafts, draft_probs, target_probs, seed=7)
    alpha = 2 / 3
    assert abs(z_score(exact.num_accepted, alpha + alpha ** 2 + alpha ** 3)) < Z_MAX
    assert z_difference(block.num_accepted, exact.num_accepted) > 10
    assert float(block.num_accepted.double().mean() - exact.num_accepted.double().mean()) > 0.1
    # and the emitted tokens are still q's (i.i.d. positions: every emitted token follows q)
    assert chi2_pvalue(block.tokens[:, 0], q) > ALPHA


# ---- pcg-block ---------------------------------------------------------------------------------------------
V4 = 4
GROUPS = [[0, 1], [1, 2], [3]]  # token 1 in two groups (N = 2), the rest in one


def group_weights(groups: list[list[int]], vocab: int) -> torch.Tensor:
    """Equal-split w[k, t] = 1/N(t), written out independently of ASGTable: [M, V] float64."""
    member = torch.zeros(len(groups), vocab, dtype=torch.float64)
    for k, g in enumerate(groups):
        member[k, g] = 1.0
    return member / member.sum(0, keepdim=True)


def hybrid_pair_law(w: torch.Tensor, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The pcg-block target at one drafted position: Pr(K, x) = Q_c(K) r(x|K), r = p(·|K) where P_c(K) > 0,
    else the q-conditional. [M, V]"""
    p_c, q_c = w @ p, w @ q
    p_cond = w * p[None, :] / p_c.clamp(min=1e-300)[:, None]
    q_cond = w * q[None, :] / q_c.clamp(min=1e-300)[:, None]
    r = torch.where((p_c > 0)[:, None], p_cond, q_cond)
    return q_c[:, None] * r


def label_joint(models: PrefixModels, w: torch.Tensor) -> torch.Tensor:
    """Pr(K_0..K_{γ-1}) when every position draws its pair from the hybrid law given the tokens before it,
    indexed by Σ_j K_j M^(γ-1-j): [M^γ] float64 (enumerated over the pair sequences)."""
    m = w.shape[0]
    out = torch.zeros(m ** GAMMA, dtype=torch.float64)
    states = [(0, 0, 1.0)]  # (prefix code, label index, probability)
    for _ in range(GAMMA):
        nxt = []
        for code, index, prob in states:
            pairs = hybrid_pair_law(w, models.draft[code], models.target[code])
            for k, x in torch.nonzero(pairs > 0).tolist():
                nxt.append((code * models.vocab + x + 1, index * m + k, prob * float(pairs[k, x])))
        states = nxt
    for _, index, prob in states:
        out[index] += prob
    return out


def complete_labels(models: PrefixModels, w: torch.Tensor, verdict, seed: int) -> torch.Tensor:
    """The emitted labels of the block's γ drafted positions (the bonus lies beyond them), continued by pairs
    from the hybrid law given the emitted tokens -> label sequence indices Long[R] (as in label_joint)."""
    gen = torch.Generator().manual_seed(seed)
    rows, m = verdict.tokens.shape[0], w.shape[0]
    laws = torch.stack([hybrid_pair_law(w, models.draft[c], models.target[c]).flatten()
                        for c in range(models.target.shape[0])])  # [codes, M·V]
    code, index = torch.zeros(rows, dtype=torch.long), torch.zeros(rows, dtype=torch.long)
    for j in range(GAMMA):
        pair = torch.multinomial(laws[code], 1, generator=gen).squeeze(1)
        emitted = j < verdict.num_emitted
        k = torch.where(emitted, verdict.groups[:, j], pair // models.vocab)
        x = torch.where(emitted, verdict.tokens[:, j], pair % models.vocab)
        code, index = models.child(code, x), index * m + k
    return index


@PATHS
def test_pcg_block_labels_follow_the_coarse_joint(ops):
    models, rows = PrefixModels(V4, seed=30, closeness=0.4), 60_000
    table = ASGTable.from_groups(GROUPS, V4)
    groups = [table.members(k).tolist() for k in range(table.num_groups)]
    w = group_weights(groups, V4)
    drafts, draft_probs, target_probs = models.block(rows, seed=8)
    verdict = verify(make_rule("pcg-block", table=table, ops=ops), drafts, draft_probs, target_probs, seed=9)
    member = w > 0
    labelled = verdict.groups >= 0
    assert bool(member[verdict.groups[labelled], verdict.tokens[labelled]].all())  # labels hold their tokens
    bonus = verdict.num_accepted == GAMMA
    assert bool((verdict.groups[bonus, GAMMA] == -1).all())
    assert bool((verdict.groups[~bonus].gather(1, verdict.num_accepted[~bonus, None]) >= 0).all())
    joint = label_joint(models, w)
    assert torch.allclose(joint.sum(), torch.tensor(1.0, dtype=torch.float64))
    labels = complete_labels(models, w, verdict, seed=10)
    assert chi2_pvalue(labels, joint) > ALPHA
    assert chi2_pvalue(labels, perturbed(joint)) < 1e-9
    # the first label alone: Q_c of the empty prefix
    assert chi2_pvalue(verdict.groups[:, 0], w @ models.target[0]) > ALPHA


@PATHS
def test_pcg_block_accepts_at_least_as_many_as_pcg_and_more_than_block(ops):
    models, rows = PrefixModels(V4, seed=40, closeness=0.4), 100_000
    table = ASGTable.from_groups(GROUPS, V4)
    drafts, draft_probs, target_probs = models.block(rows, seed=11)
    rules = {"pcg-block": make_rule("pcg-block", table=table, ops=ops), "block": make_rule("block"),
             "pcg": make_rule("pcg", table=table, residual="enumerate")}
    accepted = {name: verify(rule, drafts, draft_probs, target_probs, seed=12).num_accepted
                for name, rule in rules.items()}
    assert z_difference(accepted["pcg-block"], accepted["pcg"]) > -Z_MAX
    assert z_difference(accepted["pcg-block"], accepted["block"]) > Z_MAX  # groups add acceptance


def test_pcg_block_accepts_strictly_more_than_pcg_where_the_coarse_ratio_alternates():
    """The block case of the token rule, one level up: groups {0, 1} and {2, 3} carry P_c = (1/3, 2/3),
    Q_c = (2/3, 1/3) at every position."""
    table = ASGTable.from_groups([[0, 1], [2, 3]], V4)
    p, q, rows = torch.tensor([1 / 6, 1 / 6, 1 / 3, 1 / 3]), torch.tensor([0.5, 1 / 6, 0.25, 1 / 12]), 100_000
    draft_probs, target_probs = p.expand(rows, GAMMA, V4), q.expand(rows, GAMMA + 1, V4)
    drafts = torch.multinomial(draft_probs.reshape(-1, V4), 1, replacement=True,
                               generator=torch.Generator().manual_seed(13)).view(rows, GAMMA)
    block = verify(make_rule("pcg-block", table=table), drafts, draft_probs, target_probs, seed=14)
    pcg = verify(make_rule("pcg", table=table, residual="enumerate"), drafts, draft_probs, target_probs,
                 seed=14)
    assert z_difference(block.num_accepted, pcg.num_accepted) > 10
    assert chi2_pvalue(block.groups[:, 0], torch.tensor([2 / 3, 1 / 3], dtype=torch.float64)) > ALPHA


@PATHS
@pytest.mark.parametrize("vocab", [3, 1500])  # 1,500: the two-level sampler's path too
def test_pcg_block_over_singletons_is_block_draw_for_draw(vocab, ops):
    """Group k = {k}: the labels are the tokens, and pcg-block draws what block draws, form for form (and
    one uniform more per row, for the token inside the group, after block's): identical verdicts."""
    if vocab == 3:
        drafts, draft_probs, target_probs = PrefixModels(3, seed=50).block(20_000, seed=15)
    else:
        p, q = random_dist(vocab, 51, 0.5), random_dist(vocab, 52, 0.5)
        rows = 4000
        draft_probs = p.float().expand(rows, GAMMA, vocab)
        target_probs = (0.5 * p + 0.5 * q).float().expand(rows, GAMMA + 1, vocab)
        drafts = torch.multinomial(draft_probs.reshape(-1, vocab), 1, replacement=True,
                                   generator=torch.Generator().manual_seed(16)).view(rows, GAMMA)
    got = verify(make_rule("pcg-block", table=ASGTable.from_groups([], vocab), ops=ops), drafts, draft_probs,
                 target_probs, seed=17)
    want = verify(make_rule("block", ops=ops), drafts, draft_probs, target_probs, seed=17)
    assert 0 < int((got.num_accepted < GAMMA).sum()) < got.num_accepted.numel()  # both branches ran
    assert torch.equal(got.num_accepted, want.num_accepted)
    assert torch.equal(got.tokens, want.tokens)
    labelled = got.groups >= 0
    assert torch.equal(got.groups[labelled], got.tokens[labelled])
    assert bool((want.groups == -1).all())


def test_pcg_block_takes_no_thinning():
    with pytest.raises(ValueError, match="enumerate"):
        make_rule("pcg-block", table=ASGTable.from_groups(GROUPS, V4), residual="thinning")


def test_identical_distributions_keep_the_whole_block():
    models = PrefixModels(3, seed=60)
    models.draft = models.target
    drafts, draft_probs, target_probs = models.block(2000, seed=18)
    for name, params in [("block", {}), ("pcg-block", {"table": ASGTable.from_groups(GROUPS[:2], 3)})]:
        verdict = verify(make_rule(name, **params), drafts, draft_probs, target_probs, seed=19)
        assert bool((verdict.num_accepted == GAMMA).all()), name
