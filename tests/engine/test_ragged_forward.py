"""A forward whose rows carry different numbers of real tokens (rows verifying fewer drafts, prefill chunks of
different lengths): its matrix products run over the real tokens only (ModelRunner.forward packs them on the
CPU), each real token computes what it would in a forward of its row alone, padding tokens' hidden states
are zeros and write nothing into their rows' caches, through every CPU attention path."""

from __future__ import annotations

import pytest
import torch
from engine_support import DEVICE, save_tiny_llama
from pcgtts.engine.attention import make_backend
from pcgtts.engine.block_manager import SeqBlocks
from pcgtts.engine.model.llama import Projection
from pcgtts.engine.model.loader import load_llama
from pcgtts.engine.model_runner import ModelRunner

PROMPTS = [[1, 5, 9, 2, 7, 3, 11], [4, 4, 8, 13, 6], [2, 9, 9, 1, 3, 8]]
DRAFTS = [[3, 9, 12], [2, 14, 7], [6, 1, 0]]
REAL = [4, 2, 3]  # real tokens per row in the verify-shaped forward: the last token and 3, 1, 2 drafts
PATHS = {"rows+mirror": dict(kv_mirror_bytes=1 << 24, row_attention=True),
         "rows": dict(row_attention=True), "sdpa+mirror": dict(kv_mirror_bytes=1 << 24), "gather": dict()}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = save_tiny_llama(tmp_path_factory.mktemp("ragged") / "m", vocab=16, hidden=32, heads=4,
                           kv_heads=2, intermediate=64, layers=2, seed=7, init_std=0.3)
    return load_llama(path, DEVICE, "float32")


def runner(model, path: str) -> ModelRunner:
    backend = make_backend("sdpa", DEVICE, model.dtype, 4)
    return ModelRunner(model, num_blocks=64, block_size=4, backend=backend, decode_tokens=(1, 4),
                       **PATHS[path])


def prefilled(r: ModelRunner, rows: list[int]) -> list[SeqBlocks]:
    """The given prompts cached up to their last token, one prefill each (no padding)."""
    states = [SeqBlocks() for _ in rows]
    for st, i in zip(states, rows, strict=True):
        st.ensure(r.blocks, len(PROMPTS[i]) + 4)
        r.forward_chunks([st], [PROMPTS[i][:-1]])
    return states


@pytest.mark.parametrize("path", list(PATHS))
def test_padding_tokens_skip_the_products_and_real_tokens_compute_what_their_row_alone_would(
        model, path, monkeypatch):
    product_rows = []
    plain_product = Projection.product
    monkeypatch.setattr(Projection, "product", lambda self, x: (product_rows.append(x.shape[0]),
                                                                 plain_product(self, x))[1])
    ragged_runner = runner(model, path)
    states = prefilled(ragged_runner, [0, 1, 2])
    lengths = torch.tensor([len(p) for p in PROMPTS])
    ids = torch.tensor([[p[-1]] + d for p, d in zip(PROMPTS, DRAFTS, strict=True)])  # [B, 4]
    positions = lengths[:, None] - 1 + torch.arange(4)[None, :]
    valid = torch.arange(4)[None, :] < torch.tensor(REAL)[:, None]
    tables = ragged_runner.block_tables(states, int(lengths.max()) + 3)
    product_rows.clear()
    ragged = ragged_runner.forward(ids, positions, valid, tables, states=states)  # [B, 4, d]
    assert set(product_rows) == {sum(REAL)}  # every product over the 9 real tokens, none over 12

    assert torch.count_nonzero(ragged[~valid]) == 0
    for i, (st, n) in enumerate(zip(states, REAL, strict=True)):
        alone_runner = runner(model, path)
        alone_states = prefilled(alone_runner, [i])
        alone = alone_runner.forward_chunks(alone_states, [ids[i, :n].tolist()])  # [1, n, d]
        torch.testing.assert_close(ragged[i, :n], alone[0], rtol=1e-5, atol=1e-5)
        # padding wrote nothing the row keeps: after the real tokens, the next one decodes as the row alone's
        st.num_computed = len(PROMPTS[i]) - 1 + n
        next_ragged = ragged_runner.forward_chunks([st], [[10]])
        next_alone = alone_runner.forward_chunks(alone_states, [[10]])
        torch.testing.assert_close(next_ragged, next_alone, rtol=1e-5, atol=1e-5)
