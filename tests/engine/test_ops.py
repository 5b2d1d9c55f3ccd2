"""engine/ops: each per-step operation's torch form and compiled form on the same inputs give the same
results (one equivalence test per op), the one choice between them, and the verify's torch steps called as
plain functions over a flattened layout of drafts (what a caller without an Engine, e.g. a vLLM rejection
sampler, does)."""

from __future__ import annotations

import pytest
import torch
from pcgtts.asg_tables import ASGTable
from pcgtts.engine.acceptance.sampling import VerifyUniforms, sample_rows
from pcgtts.engine.model.rope import RotaryEmbedding
from pcgtts.engine.ops import COMPILED_MAX_V, TORCH_OPS, Ops, Twin
from pcgtts.engine.ops.marker_merge import MARKER_MERGE
from pcgtts.engine.ops.rms_norm import RMS_NORM
from pcgtts.engine.ops.rope_kv import ROPE_KV
from pcgtts.engine.ops.softmax_draw import SOFTMAX_DRAW
from pcgtts.engine.ops.verify import (
    BLOCK_GROUP_VERIFY,
    BLOCK_VERIFY,
    GROUP_VERIFY,
    TOKEN_VERIFY,
    GroupLayout,
    group_test,
    group_verify_torch,
    residual_draw,
)
from pcgtts.engine.speech.demo.constraint import MarkerMergeConstraint
from pcgtts.engine.speech.demo.layout import DemoVocab


def both_forms(op: Twin, make_args):
    """(torch form's result, compiled form's result), each called on its own copy of the same inputs."""
    return op.torch(*make_args()), op.compiled(*make_args())


def test_the_compiled_forms_apply_on_cpu_up_to_the_bound_when_enabled():
    assert Ops.choose("cpu", 1200) == Ops(compiled=True)
    assert Ops.choose("cpu", COMPILED_MAX_V + 1) == TORCH_OPS
    assert Ops.choose("cpu", 1200, enabled=False) == TORCH_OPS
    assert Ops.choose("meta", 1200) == TORCH_OPS  # any other device: the torch ops
    op = Twin(torch=lambda: "torch", compiled=lambda: "compiled")
    assert Ops(compiled=True).form(op)() == "compiled" and TORCH_OPS.form(op)() == "torch"


@pytest.mark.parametrize("rows", [1, 256])
def test_softmax_draw_forms_agree(rows):
    """softmax(logits / T) and the token drawn from it with the same uniform, written into strided rows (a
    position of the draft's [B, γ, V] buffer) and nowhere else, masked columns never drawn."""
    gen = torch.Generator().manual_seed(8 + rows)
    vocab = 1200
    logits = 4 * torch.randn(rows, vocab, generator=gen)
    logits[::7, :600] = torch.finfo(torch.float32).min  # masked columns (what a constraint leaves)
    temperature = 0.3 + torch.rand(rows, generator=gen)
    u = torch.rand(rows, generator=gen, dtype=torch.float64)
    buffers = []

    def make_args():
        buffers.append(torch.zeros(rows, 3, vocab))
        return logits.clone(), temperature, u, buffers[-1][:, 1]

    (probs_t, tokens_t), (probs_c, tokens_c) = both_forms(SOFTMAX_DRAW, make_args)
    torch.testing.assert_close(probs_c, probs_t, rtol=1e-5, atol=1e-8)
    assert torch.equal(tokens_c, tokens_t)
    assert torch.equal(tokens_t, sample_rows(probs_t.contiguous(), None, u))
    for buffer, probs in zip(buffers, (probs_t, probs_c), strict=True):
        assert probs.data_ptr() == buffer[:, 1].data_ptr()  # written into the given position
        assert not bool(buffer[:, 0].any() or buffer[:, 2].any())  # and only there
    assert bool((tokens_t[::7] >= 600).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_marker_merge_forms_agree(dtype):
    """The same logits for free, forced and held rows, including a row whose marker logits are all -inf
    (merged mass -inf, not NaN); in float32 and in bfloat16 (the compiled loop computes in float32 and
    float64 and stores the dtype's values)."""
    vocab = DemoVocab(phonemes=("@", "I", "_", "d", "h", "l", "oU", "w", "3:"), codebook_size=64)
    merge_cols, closed = MarkerMergeConstraint(vocab, [16])._masks(torch.device("cpu"))
    gen = torch.Generator().manual_seed(6)
    flat = (4 * torch.randn(64, vocab.vocab_size, generator=gen)).to(dtype)
    flat[3, merge_cols] = float("-inf")
    targets = torch.randint(int(merge_cols.min()), int(merge_cols.max()) + 1, (64,), generator=gen).tolist()
    forced = (torch.rand(64, generator=gen) < 0.2).tolist()
    held = [h and not f for h, f in zip((torch.rand(64, generator=gen) < 0.2).tolist(), forced, strict=True)]
    forced[3] = held[3] = False
    want, got = both_forms(MARKER_MERGE, lambda: (flat.clone(), merge_cols, closed, targets, forced, held))
    assert any(forced) and any(held) and got.dtype == dtype and not bool(torch.isnan(got).any())
    assert got[3, targets[3]].item() == float("-inf")
    torch.testing.assert_close(got, want, rtol=1e-6 if dtype == torch.float32 else 1e-2, atol=0.0)


def overlapping_table(vocab: int, seed: int) -> ASGTable:
    """Groups of 3 around every other token, overlapping (N(t) from 1 to several), as real tables are."""
    near = torch.randint(0, vocab, (vocab,), generator=torch.Generator().manual_seed(seed))
    return ASGTable.from_groups([[t, int(near[t]), int(near[near[t]])] for t in range(0, vocab, 2)], vocab)


def verify_inputs(batch: int, gamma: int, vocab: int, step: int, gen: torch.Generator):
    """Near drafts on odd steps, far ones on even steps, so rejections, bonus tokens and every accepted
    count occur: (drafts, p [B, γ, V], q [B, γ+1, V])."""
    target_logits = 3 * torch.randn(batch, gamma + 1, vocab, generator=gen)
    noise = (0.3 if step % 2 else 3.0) * torch.randn(batch, gamma, vocab, generator=gen)
    q, p = target_logits.softmax(-1), (target_logits[:, :gamma] + noise).softmax(-1)
    drafts = torch.multinomial(p.reshape(-1, vocab), 1, generator=gen).view(batch, gamma)
    return drafts, p, q


@pytest.mark.parametrize("batch", [1, 6, 64])
@pytest.mark.parametrize("op", [GROUP_VERIFY, BLOCK_GROUP_VERIFY], ids=["pcg", "pcg-block"])
def test_group_verify_forms_agree(op, batch):
    """Over real overlapping groups at the demo bundle's vocabulary, from the same uniforms. pcg: the same
    accepted counts always (both test in float64), the same emitted token and group but where a draw lands
    within float32 rounding of a step of the residual's cumulative sum (the torch ops sum groups in float32,
    the loop in float64). pcg-block: the same accepted counts, tokens and groups but where a stop test or a
    draw lands within float32 rounding of its threshold (the torch ops sum group masses by a sparse product,
    the loop member by member). Either: at most 1 row in 1,000."""
    vocab, gamma = 1200, 3
    layout = GroupLayout(overlapping_table(vocab, batch))
    gen = torch.Generator().manual_seed(batch if op is GROUP_VERIFY else 10 + batch)
    counts = torch.zeros(gamma + 1, dtype=torch.long)
    differing = 0
    for step in range(40):
        drafts, p, q = verify_inputs(batch, gamma, vocab, step, gen)
        u = VerifyUniforms.draw(gen, batch, gamma, torch.device("cpu"), in_group=True)
        want, got = both_forms(op, lambda: (layout, drafts, p, q, u))  # noqa: B023
        if op is GROUP_VERIFY:
            assert torch.equal(got.num_accepted, want.num_accepted)
        differing += int(((got.tokens != want.tokens) | (got.groups != want.groups)
                          | (got.num_accepted != want.num_accepted)[:, None]).any(1).sum())
        counts += torch.bincount(got.num_accepted, minlength=gamma + 1)
    assert differing <= 40 * batch // 1000
    assert bool((counts > 0).all())  # every accepted count, from a rejection at 0 to the bonus token


@pytest.mark.parametrize("op", [TOKEN_VERIFY, BLOCK_VERIFY], ids=["token", "block"])
def test_token_level_verify_forms_agree(op):
    """Same uniforms, same verdicts, at the demo vocabulary and a small one. Token: the group loop over
    singleton groups is the token-level rule. Block: the loop forms the weighted excess in float32 as the
    torch ops do; only its masses are summed in another order (float64 in the loop), which could move a
    stop test landing within rounding of its threshold (never here). Calls of 32 rows, so that the torch ops
    draw with one cumulative sum, as the loop does (the two-level sampler of larger calls rounds differently
    and may move a draw that lands within rounding of a step)."""
    rows, gamma, seen = 32, 3, set()
    gen = torch.Generator().manual_seed(3 if op is TOKEN_VERIFY else 4)
    for vocab in (12, 1200):
        for step in range(150):
            drafts, p, q = verify_inputs(rows, gamma, vocab, step, gen)
            u = VerifyUniforms.draw(gen, rows, gamma, torch.device("cpu"))
            want, got = both_forms(op, lambda: (drafts, p, q, u))  # noqa: B023
            assert torch.equal(got.num_accepted, want.num_accepted) and torch.equal(got.tokens, want.tokens)
            assert bool((got.groups == -1).all())  # token-level: no group labels
            seen |= set(got.num_accepted.tolist())
    assert seen == set(range(gamma + 1))


def test_padded_and_ragged_layouts_give_the_same_verdicts():
    """The torch form reads group masses from padded member rows (small tables) or ragged CSR rows (large
    ones): the same verdicts from the same uniforms."""
    vocab, gamma, batch = 600, 3, 16
    table = overlapping_table(vocab, 1)
    padded, ragged = GroupLayout(table), GroupLayout(table, padded=False)
    gen = torch.Generator().manual_seed(2)
    differing = 0
    for step in range(20):
        drafts, p, q = verify_inputs(batch, gamma, vocab, step, gen)
        u = VerifyUniforms.draw(gen, batch, gamma, torch.device("cpu"), in_group=True)
        a, b = group_verify_torch(padded, drafts, p, q, u), group_verify_torch(ragged, drafts, p, q, u)
        assert torch.equal(a.num_accepted, b.num_accepted)
        differing += int(((a.tokens != b.tokens) | (a.groups != b.groups)).any(1).sum())
    assert differing <= 1


def test_group_steps_serve_a_flattened_layout_of_drafts():
    """A caller with vLLM's layout (drafts of all requests concatenated, draft_token_ids [N],
    cu_num_draft_tokens [B], p and q at the draft positions [N, V], q at each bonus position [B, V]) calls
    group_test over all N drafts and residual_draw at each request's emission position, and gets what the
    rule's batched verify gives each request alone from the same uniforms."""
    vocab = 300
    layout = GroupLayout(overlapping_table(vocab, 4))
    gen = torch.Generator().manual_seed(5)
    num_drafts = [3, 1, 4, 2, 3]
    cu_num_draft_tokens = torch.tensor(num_drafts).cumsum(0)
    per_request = [verify_inputs(1, k, vocab, r, gen) for r, k in enumerate(num_drafts)]
    uniforms = [VerifyUniforms.draw(gen, 1, k, torch.device("cpu"), in_group=True) for k in num_drafts]
    draft_token_ids = torch.cat([d[0] for d, _, _ in per_request])  # [N]
    draft_probs = torch.cat([p[0] for _, p, _ in per_request])  # [N, V]
    target_probs = torch.cat([q[0, :-1] for _, _, q in per_request])  # [N, V]
    bonus_probs = torch.stack([q[0, -1] for _, _, q in per_request])  # [B, V]
    u_accept = torch.cat([u.accept[0] for u in uniforms])  # [N]

    labels, accepted = group_test(layout, draft_token_ids, u_accept, draft_probs, target_probs)  # [N] each
    starts = cu_num_draft_tokens - torch.tensor(num_drafts)
    excess, q_rows, num_accepted = [], [], []
    for start, k in zip(starts.tolist(), num_drafts, strict=True):
        n = int(accepted[start:start + k].long().cumprod(0).sum())  # the accepted prefix
        num_accepted.append(n)
        if n < k:  # rejected at start + n: the residual of q - p there
            excess.append(target_probs[start + n] - draft_probs[start + n])
            q_rows.append(target_probs[start + n])
        else:  # all accepted: the bonus position, no draft there
            excess.append(bonus_probs[len(q_rows)].clone())
            q_rows.append(bonus_probs[len(q_rows)])
    u_group, u_token = torch.cat([u.emit for u in uniforms]), torch.cat([u.token for u in uniforms])
    tokens, groups = residual_draw(layout, torch.stack(excess), torch.stack(q_rows), u_group, u_token)

    assert 0 < sum(n < k for n, k in zip(num_accepted, num_drafts, strict=True)) < len(num_drafts)
    for r, ((drafts, p, q), u) in enumerate(zip(per_request, uniforms, strict=True)):
        alone = group_verify_torch(layout, drafts, p, q, u)
        n = num_accepted[r]
        assert int(alone.num_accepted[0]) == n
        assert int(alone.tokens[0, n]) == int(tokens[r])
        start = int(starts[r])
        assert torch.equal(alone.groups[0, :n], labels[start:start + n])
        assert int(alone.groups[0, n]) == (int(groups[r]) if n < num_drafts[r] else -1)  # bonus: unlabelled


@pytest.mark.parametrize("store", [torch.float16, torch.float32])
@pytest.mark.parametrize("mirrored", [True, False])
def test_rope_kv_forms_rotate_and_write_the_same_bits(store, mirrored):
    """A layer's fused projection output rotated (q returned, k written) and v written, into pool slots
    and mirror slots, positions and pool slots given as strided columns (a draft step's): both forms the
    same bits, fp16 stores rounded alike (halfway values, overflow to inf, subnormals), nothing else
    touched."""
    gen = torch.Generator().manual_seed(3)
    heads, kv_heads, dim = 4, 2, 16
    rope = RotaryEmbedding(dim, 10000.0, None, 64, torch.device("cpu"), torch.float32, interleaved=True)
    v_from = (heads + kv_heads) * dim  # v's columns in qkv
    qkv = 4 * torch.randn(10, v_from + kv_heads * dim, generator=gen)
    qkv[0, v_from:v_from + 4] = torch.tensor([65519.0, 70000.0, 1e-6, 1 + 2 ** -11])  # fp16 rounding edges
    positions = torch.randint(0, 64, (10, 3), generator=gen)[:, 2]  # a strided column, as a draft step's
    pool_slots = torch.randperm(40, generator=gen)[:30].view(10, 3)[:, 1]
    mirror_slots = torch.randperm(20, generator=gen)[:10] if mirrored else None
    results = []
    for form in (ROPE_KV.torch, ROPE_KV.compiled):
        stores = [torch.full((n, kv_heads, dim), 7.0, dtype=store) for n in (40, 40, 20, 20)]
        mirror = stores[2:] if mirrored else (None, None)
        results.append((form(qkv, rope, positions, heads, kv_heads, *stores[:2], pool_slots, *mirror,
                             mirror_slots), stores))
    (q_torch, stores_torch), (q_compiled, stores_compiled) = results
    assert torch.equal(q_torch, q_compiled)
    bits = (lambda t: t.view(torch.int16)) if store == torch.float16 else (lambda t: t)
    for a, b in zip(stores_torch, stores_compiled, strict=True):
        assert torch.equal(bits(a), bits(b))
    rotated = rope.rotate(qkv[:, :v_from].view(10, 1, heads + kv_heads, dim),
                          rope.lookup(positions.view(10, 1))).view(10, heads + kv_heads, dim)
    assert torch.equal(q_compiled, rotated[:, :heads])
    pool_k, pool_v = stores_compiled[:2]
    assert torch.equal(pool_k[pool_slots], rotated[:, heads:].to(store))
    assert torch.equal(pool_v[pool_slots], qkv[:, v_from:].view(10, kv_heads, dim).to(store))
    untouched = torch.ones(40, dtype=torch.bool)
    untouched[pool_slots] = False
    assert bool((pool_k[untouched] == 7.0).all())
    if mirrored:
        assert torch.equal(bits(stores_compiled[2][mirror_slots]), bits(pool_k[pool_slots]))


def test_rms_norm_forms_agree_and_the_compiled_one_computes_a_row_alike_in_any_call():
    """The compiled RMSNorm gives Hugging Face's formula to float32 rounding on decode- and prefill-sized
    inputs and strided rows (a norm of a slice), and each row the same bits alone or among any others (what
    lets it serve batch-invariant forwards)."""
    gen = torch.Generator().manual_seed(5)
    weight = torch.randn(256, generator=gen)
    for shape in [(1, 1, 256), (16, 4, 256), (3, 300, 256)]:
        x = 3 * torch.randn(*shape, generator=gen)
        reference = weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
        assert torch.equal(RMS_NORM.torch(x, weight, 1e-6), reference)
        torch.testing.assert_close(RMS_NORM.compiled(x, weight, 1e-6), reference, rtol=2e-6, atol=2e-6)
    rows = 3 * torch.randn(40, 512, generator=gen)[:, :256]  # strided rows
    together = RMS_NORM.compiled(rows, weight, 1e-6)
    torch.testing.assert_close(together, RMS_NORM.torch(rows, weight, 1e-6), rtol=2e-6, atol=2e-6)
    for i in (0, 17, 39):
        assert torch.equal(RMS_NORM.compiled(rows[i:i + 1].clone(), weight, 1e-6), together[i:i + 1])
