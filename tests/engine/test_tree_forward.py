"""A token tree's verify forward (engine/attention.py TreeLayout): each branch's tokens compute what they
would as a chain after the same prefix, through every CPU attention path (rows' own attention over the KV
mirror, torch's kernel with a mask over the mirror, gathered blocks), and after the accepted branch's K/V
moves to a chain's place (ModelRunner.move_kv) the next forward is the chain's."""

from __future__ import annotations

import pytest
import torch
from engine_support import DEVICE, save_tiny_llama
from pcgtts.engine.attention import TreeLayout, make_backend
from pcgtts.engine.block_manager import SeqBlocks
from pcgtts.engine.model.loader import load_llama
from pcgtts.engine.model_runner import ModelRunner

PROMPTS = [[1, 5, 9, 2, 7, 3, 11], [4, 4, 8, 13, 6]]
K, G = 3, 2  # branches, drafts per branch
PATHS = {"rows+mirror": dict(kv_mirror_bytes=1 << 24, row_attention=True),
         "sdpa+mirror": dict(kv_mirror_bytes=1 << 24), "gather": dict()}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = save_tiny_llama(tmp_path_factory.mktemp("tree") / "m", vocab=16, hidden=32, heads=4, kv_heads=2,
                           intermediate=64, layers=2, seed=5, init_std=0.3)
    return load_llama(path, DEVICE, "float32")


def runner(model, path: str) -> ModelRunner:
    backend = make_backend("sdpa", DEVICE, model.dtype, 4)
    return ModelRunner(model, num_blocks=64, block_size=4, backend=backend,
                       decode_tokens=(1, G + 1), tree_tokens=1 + K * G, **PATHS[path])


def prefilled(r: ModelRunner) -> list[SeqBlocks]:
    """Both prompts cached up to their last token (which the tree forward feeds)."""
    states = [SeqBlocks() for _ in PROMPTS]
    for st, p in zip(states, PROMPTS, strict=True):
        st.ensure(r.blocks, len(p) + K * G)
    r.forward_chunks(states, [p[:-1] for p in PROMPTS])
    return states


@pytest.mark.parametrize("path", list(PATHS))
def test_each_branch_computes_what_its_chain_would_and_the_kept_branch_continues_as_a_chain(model, path):
    branches = torch.tensor([[[3, 9], [12, 1], [6, 6]], [[2, 14], [7, 0], [9, 5]]])  # [B, K, G]
    tree_runner = runner(model, path)
    states = prefilled(tree_runner)
    lengths = torch.tensor([len(p) for p in PROMPTS])
    layout, positions = TreeLayout.of(lengths, K, G)
    ids = torch.cat([torch.tensor([[p[-1]] for p in PROMPTS]), branches.flatten(1)], dim=1)
    tables = tree_runner.block_tables(states, int(lengths.max()) + K * G)
    tree = tree_runner.forward(ids, positions, torch.ones_like(ids, dtype=torch.bool), tables, states=states,
                               tree=layout)  # [B, 1 + K·G, d]
    for st, n in zip(states, lengths.tolist(), strict=True):
        st.num_computed = n + K * G
    for b in range(K):
        chain_runner = runner(model, path)
        chain_states = prefilled(chain_runner)
        chain = chain_runner.forward_chunks(chain_states, [[p[-1]] + branches[i, b].tolist()
                                                           for i, p in enumerate(PROMPTS)])
        columns = [0] + list(range(1 + b * G, 1 + (b + 1) * G))
        torch.testing.assert_close(tree[:, columns], chain, rtol=1e-5, atol=1e-5)
    # keep branch 2's two drafts: moved to where a chain's are, the next token decodes as after the chain
    kept = 2
    for st, n in zip(states, lengths.tolist(), strict=True):
        tree_runner.move_kv(st, n + kept * G, n, G)
        st.roll_back(tree_runner.blocks, n + G)
    chain_runner = runner(model, path)
    chain_states = prefilled(chain_runner)
    chain_runner.forward_chunks(chain_states, [[p[-1]] + branches[i, kept].tolist()
                                               for i, p in enumerate(PROMPTS)])
    after_tree = tree_runner.forward_chunks(states, [[10, 3]] * 2)
    after_chain = chain_runner.forward_chunks(chain_states, [[10, 3]] * 2)
    torch.testing.assert_close(after_tree, after_chain, rtol=1e-5, atol=1e-5)
