"""Batch invariance of the forwards (engine/batch_invariance.py): a row's hidden states, logits and the K/V it
writes are the same bits alone and beside any other rows, for one query or a verify's γ+1 or a prefill
chunk of any size, over the KV mirror or the gathered pool, whatever the batch's longest context.

On the embedded model's real shapes. Where this machine's kernels need padding at all (calibrated quantum
above 1), the same comparisons without the plan find a difference, so these tests would catch a change that
broke the plan."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
import torch
from pcgtts.engine import Engine, EngineConfig
from pcgtts.engine.batch_invariance import PLAIN, ROW_QUANTA, invariant_anywhere, random_rows, rows_invariant
from pcgtts.engine.block_manager import SeqBlocks
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle

BUNDLE = ModelBundle.from_dir(DEFAULT_MODEL_DIR)
GAMMA = 3


# mirror / gather: attention of each row over its own keys (engine/ops/row_attention.py, the CPU default);
# sdpa-mirror: torch's attention kernel over the mirror with the plan's padded contexts (compiled ops off);
# each with the fp16 copy of the bundle's weights, fp32-mirror with MKL's fp32 products, bf16-mirror with
# the bf16 copies where oneDNN keeps their rows alike (where it has no native bf16: the fp16 copies)
@pytest.fixture(scope="module", params=["mirror", "gather", "sdpa-mirror", "fp32-mirror", "bf16-mirror"])
def engine(request):
    mirror = 0 if request.param == "gather" else (512 << 20)
    weights = {"fp32-mirror": "fp32", "bf16-mirror": "bf16"}.get(request.param, "fp16")
    return Engine(EngineConfig(target=BUNDLE.target_dir, draft=BUNDLE.draft_dir, num_speculative_tokens=GAMMA,
                               deterministic="always", kv_mirror_bytes=mirror, max_num_seqs=16,
                               compiled_cpu_ops=request.param != "sdpa-mirror", cpu_weights=weights))


def use(engine: Engine, plan) -> None:
    for part in (engine.target, engine.head):
        part.apply_plan(plan)


class Rows:
    """Sequences with prefilled random contexts in the target's pool, and one-step forwards over them."""

    def __init__(self, engine: Engine, lengths: list[int], seed: int = 0):
        self.runner = engine.target
        rng = random.Random(seed)
        self.rows = []
        for n in lengths:
            st = SeqBlocks()
            st.ensure(self.runner.blocks, n + GAMMA + 1)
            tokens = [rng.randrange(engine.vocab_size) for _ in range(n)]
            self.runner.forward_chunks([st], [tokens[:-1]])
            self.rows.append((st, tokens))

    def forward(self, order: list[int], t: int) -> list[tuple[torch.Tensor, ...]]:
        """One forward of rows `order` (T tokens each at positions n-1..) -> per row (hidden [T, d],
        logits [T, V], K and V of layer 0 and the last layer at those positions); positions are rolled
        back afterwards so the forward can be repeated."""
        runner, rows = self.runner, [self.rows[i] for i in order]
        ids = torch.tensor([[toks[-1]] + [7] * (t - 1) for _, toks in rows])
        pos = torch.tensor([list(range(len(toks) - 1, len(toks) - 1 + t)) for _, toks in rows])
        states = [st for st, _ in rows]
        tables = runner.block_tables(states, max(len(toks) for _, toks in rows) + t)
        hidden = runner.forward(ids, pos, torch.ones_like(ids, dtype=torch.bool), tables, states=states)
        logits = runner.logits(hidden)
        out = []
        for b, (st, toks) in enumerate(rows):
            out.append((hidden[b], logits[b], *kv_at(runner, st, range(len(toks) - 1, len(toks) - 1 + t))))
            st.num_computed = len(toks) - 1
        return out

    def release(self) -> None:
        for st, _ in self.rows:
            st.release(self.runner.blocks)


def kv_at(runner, state: SeqBlocks, positions) -> list[torch.Tensor]:
    """K and V of the first and the last layer at a sequence's `positions`, from the pool."""
    bs = runner.block_size
    slots = torch.tensor([state.blocks[p // bs] * bs + p % bs for p in positions])
    layers = (0, len(runner.cache.keys) - 1)
    return [t[slots].clone() for i in layers for t in runner.cache.layer(i)]


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


# batch mates' lengths: contexts on either side of a 512-key tile
MATES = [40, 700, 250, 17, 300, 64, 530, 90]


def mismatches(engine: Engine, t: int, probe: int) -> list[str]:
    """Every (batch, place) in which the forward of a probe row of `probe` tokens differs from its forward
    alone."""
    rows = Rows(engine, [probe, *MATES])
    try:
        alone = rows.forward([0], t)[0]
        bad = []
        for k in (1, 2, 3, 5, len(MATES)):
            others = list(range(1, k + 1))
            for place in (0, k):
                order = others[:place] + [0] + others[place:]
                if not same(rows.forward(order, t)[place], alone):
                    bad.append(f"{k + 1} rows, probe at {place}")
        return bad
    finally:
        rows.release()


# probe contexts: short, and with its last key block between 192 and 384 keys long (where MKL's GEMM in the
# attention kernel splits the block by its length), before and after the first 512-key tile
PROBES = [100, 300, 800]


@pytest.mark.parametrize("tokens", [1, GAMMA + 1], ids=["one-token", "verify"])
@pytest.mark.parametrize("probe", PROBES)
def test_a_rows_forward_is_the_same_alone_and_in_any_batch(engine, tokens, probe):
    use(engine, engine.invariance)
    assert engine.invariance.active
    assert mismatches(engine, tokens, probe) == []


@pytest.mark.parametrize("tokens", [1, GAMMA + 1], ids=["one-token", "verify"])
def test_without_the_plan_forwards_depend_on_the_batch(engine, tokens):
    """The property the plan buys is real on this machine: without it a one-token row rounds differently
    beside three others (MKL's few-row GEMM kernel), and a verify row differently beside a longer context
    (torch's attention kernel's key blocks; the rows' own attention has none, and a verify's GEMMs have
    at least γ+1 rows whatever the batch)."""
    if engine.invariance.row_quantum == 1:
        pytest.skip("this machine's GEMMs need no row padding")
    if tokens > 1 and engine.target.row_attention:
        pytest.skip("each row attends over its own keys: nothing in a verify forward depends on the batch")
    use(engine, PLAIN)
    try:
        assert any(mismatches(engine, tokens, probe) for probe in PROBES)
    finally:
        use(engine, engine.invariance)


def test_prefill_chunks_and_decode_steps_write_the_same_kv(engine):
    """A prompt's K/V and last hidden state do not depend on how it is cut into prefill chunks, on what is
    prefilled beside it (rows left-padded to the longest), or on whether decode steps computed them:
    preemption recompute and prefix-cache sharing read the same bits."""
    use(engine, engine.invariance)
    runner = engine.target
    rng = random.Random(3)
    tokens = [rng.randrange(engine.vocab_size) for _ in range(560)]
    other = [rng.randrange(engine.vocab_size) for _ in range(300)]

    def run(chunks: list[int], beside: bool = False, decode_tail: int = 0):
        st, mate = SeqBlocks(), SeqBlocks()
        st.ensure(runner.blocks, len(tokens) + 4)
        mate.ensure(runner.blocks, len(other) + 4)
        last = None
        for c in chunks:
            piece = tokens[st.num_computed: st.num_computed + c]
            if beside and mate.num_computed < len(other):
                mate_piece = other[mate.num_computed: mate.num_computed + 2 * c]
                h = runner.forward_chunks([mate, st], [mate_piece, piece])
                last = h[1, -1]
            else:
                last = runner.forward_chunks([st], [piece])[0, -1]
        for _ in range(decode_tail):  # one token per forward, as a target-only decode step
            n = st.num_computed
            ids, pos = torch.tensor([[tokens[n]]]), torch.tensor([[n]])
            tables = runner.block_tables([st], n + 1)
            valid = torch.ones_like(ids, dtype=torch.bool)
            last = runner.forward(ids, pos, valid, tables, states=[st])[0, -1]
            st.num_computed += 1
        kv = kv_at(runner, st, range(len(tokens)))
        st.release(runner.blocks)
        mate.release(runner.blocks)
        return kv, last

    reference = run([len(tokens)])
    for label, args in [("halves", ([280, 280],)), ("uneven", ([1, 99, 377, 83],)),
                        ("blocks of 16", ([16] * 35,)), ("beside another prompt", ([200, 200, 160], True)),
                        ("decode steps for the last 6", ([554], False, 6))]:
        got = run(*args)
        assert same(got[0], reference[0]) and torch.equal(got[1], reference[1]), label


def test_feature_head_rows_are_batch_invariant(engine):
    use(engine, engine.invariance)
    head, gen = engine.head, torch.Generator().manual_seed(5)
    states = torch.randn(9, engine.target_config.hidden_size, generator=gen)
    tokens = torch.randint(0, engine.vocab_size, (9,), generator=gen)
    alone = engine.target.logits(head(states[:1], tokens[:1])[:, None])[0]
    for n in (2, 3, 4, 9):
        assert torch.equal(engine.target.logits(head(states[:n], tokens[:n])[:, None])[0], alone), n


def test_each_projection_is_row_invariant_at_the_calibrated_quantum(engine):
    q = engine.invariance.row_quantum
    assert q in ROW_QUANTA
    use(engine, engine.invariance)
    for p in engine.target.model.projections() + engine.head.projections():
        assert rows_invariant(p.product, random_rows(64, p.in_features, engine.device, engine.dtype), q)


def test_invariant_anywhere_catches_rows_that_depend_on_their_count_or_their_place():
    """The start-up check of bf16 products: a row-by-row function passes; one whose rows change with the
    call's row count, or with a row's place in the call (past the first 16 rows only), fails."""
    x = torch.randn(40, 8)
    assert invariant_anywhere(lambda t: t * 2.0 + 1.0, x)
    assert not invariant_anywhere(lambda t: t * len(t), x)
    assert not invariant_anywhere(lambda t: torch.cat([t[:16], t[16:] * (1 + 2 ** -20)]), x)


CALIBRATE = """
import json, torch
from pcgtts.engine import Engine, EngineConfig
from pcgtts.engine.batch_invariance import ROW_QUANTA, random_rows, rows_invariant
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle
torch.set_num_threads(1)
b = ModelBundle.from_dir(DEFAULT_MODEL_DIR)
e = Engine(EngineConfig(target=b.target_dir, draft=b.draft_dir, deterministic="always", cpu_weights="fp32"))
q = e.invariance.row_quantum
projections = e.target.model.projections() + e.head.projections()
checks = [(p.product, random_rows(64, p.in_features, e.device, e.dtype)) for p in projections]
print(json.dumps({"quantum": q, "holds": all(rows_invariant(fn, x, q) for fn, x in checks),
                  "smaller_fails": [not all(rows_invariant(fn, x, s) for fn, x in checks)
                                    for s in ROW_QUANTA if s < q]}))
"""


@pytest.mark.skipif("mkl" not in torch.__config__.show().lower(), reason="needs torch built with MKL")
def test_calibration_follows_the_gemm_code_path(tmp_path):
    """MKL's conditional-numerical-reproducibility mode computes products by other kernels (there, rows
    are alike only in multiples of 8): the engine measures that at start-up and pads accordingly."""
    env = {**os.environ, "MKL_CBWR": "COMPATIBLE"}
    out = subprocess.run([sys.executable, "-c", CALIBRATE], env=env, capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    there = json.loads(out.stdout.strip().splitlines()[-1])
    default = Engine(EngineConfig(target=BUNDLE.target_dir, deterministic="always",
                                  cpu_weights="fp32")).invariance.row_quantum
    assert there["quantum"] > default and there["holds"] and all(there["smaller_fails"]), there


def test_an_engine_of_one_sequence_gets_the_plan_of_a_larger_one():
    """Target-only with max_num_seqs=1: its LM head never sees more than one row, yet runs padded to the
    quantum; the calibration checks it there too (it once checked one row, found no quantum that every
    product shared, and dropped the seed promise, on a machine whose products need 2)."""
    def plan(n):
        config = EngineConfig(target=BUNDLE.target_dir, deterministic="always", max_num_seqs=n)
        return Engine(config).invariance

    one = plan(1)
    assert one.active and one.row_quantum == plan(16).row_quantum


def test_engines_attending_by_rows_do_not_measure_torchs_attention(monkeypatch):
    """Where every forward under the plan attends by the rows' own attention (invariant by construction),
    the plan pads no queries and no contexts, and torch's kernel is not measured: on a machine where no
    padding makes that kernel invariant (simulated here), such an engine keeps the seed promise, and one
    that runs torch's kernel ("sdpa") refuses deterministic="always"."""
    from pcgtts.engine import batch_invariance

    monkeypatch.setattr("pcgtts.engine.llm_engine.CALIBRATIONS", {})
    monkeypatch.setattr(batch_invariance, "attention_invariant", lambda *args: False)

    def config(attention):
        return EngineConfig(target=BUNDLE.target_dir, draft=BUNDLE.draft_dir, num_speculative_tokens=GAMMA,
                            deterministic="always", cpu_attention=attention)

    rows = Engine(config("rows")).invariance
    assert rows.active and (rows.query_quantum, rows.min_keys) == (1, 0)
    assert rows.context(17) == 17  # contexts are not padded
    with pytest.raises(ValueError, match="batch-invariant"):
        Engine(config("sdpa"))
