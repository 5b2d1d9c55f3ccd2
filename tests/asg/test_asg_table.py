"""ASGTable: explicit groups, CSR queries, the coarse distribution, and storage."""

from __future__ import annotations

import pytest
import torch
from pcgtts.asg_tables import ASGTable, build_asg


def test_from_groups_adds_singletons_and_merges_duplicates():
    table = ASGTable.from_groups([[1, 0], [2, 1], [0, 1, 1], [4]], vocab_size=6)
    assert [table.members(k).tolist() for k in range(table.num_groups)] == [[0, 1], [1, 2], [4], [3], [5]]
    assert table.groups_of(1).tolist() == [0, 1]
    assert table.members(0).dtype == torch.long and table.groups_of(0).dtype == torch.long
    with pytest.raises(ValueError):
        ASGTable.from_groups([[0, 6]], vocab_size=6)


@pytest.mark.parametrize("method", ["sparse", "index_add"])
def test_coarse_is_the_equal_split_sum(method):
    groups = [[0, 1, 2], [2, 3], [3, 4, 5], [5, 0]]
    table = ASGTable.from_groups(groups, vocab_size=7)
    probs = torch.softmax(torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(0)), dim=-1)
    coarse = table.coarse(probs, method=method)
    assert coarse.shape == (2, 3, table.num_groups)
    owners = {t: sum(t in g for g in groups) or 1 for t in range(7)}
    for k in range(table.num_groups):
        expected = sum(probs[..., t] / owners[t] for t in table.members(k).tolist())
        torch.testing.assert_close(coarse[..., k], expected)
    torch.testing.assert_close(coarse.sum(-1), torch.ones(2, 3))


def test_group_mass_and_label_draws_agree_with_coarse():
    table = ASGTable.from_groups([[0, 1, 2], [2, 3], [3, 4, 5], [5, 0]], vocab_size=7)
    probs = torch.softmax(torch.randn(4, 7, generator=torch.Generator().manual_seed(1)), dim=-1)
    rows = torch.tensor([0, 1, 2, 3, 3])
    groups = torch.tensor([0, 1, 2, 3, 4])
    mass = table.group_mass(probs, (rows,), groups)
    torch.testing.assert_close(mass.float(), table.coarse(probs)[rows, groups])
    # K ~ uniform over S(t): token 2 is in groups 0 and 1
    u = torch.linspace(0, 0.999, 1000, dtype=torch.float64)
    labels, rest = table.draw_label(torch.full((1000,), 2), u)
    assert labels.bincount().tolist() == [500, 500]
    # the fractional part of u·N(t) is again uniform, whichever label was drawn
    torch.testing.assert_close(rest, (2 * u) % 1.0)


def test_save_load_round_trip(tmp_path):
    emb = torch.randn(64, 8, generator=torch.Generator().manual_seed(2))
    table = build_asg(emb, 0.5, offset=3, vocab_size=70, progress=False, meta={"source": "unit-test"})
    path = tmp_path / "asg.safetensors"
    table.save(path)
    loaded = ASGTable.load(path)
    for name in ("group_indptr", "group_members", "token_indptr", "token_groups", "seed_group"):
        assert torch.equal(getattr(loaded, name), getattr(table, name)), name
        assert getattr(loaded, name).dtype == torch.int32
    assert loaded.vocab_size == 70 and loaded.num_groups == table.num_groups
    assert loaded.meta == table.meta and loaded.meta["source"] == "unit-test"
    probs = torch.softmax(torch.randn(5, 70), dim=-1)
    torch.testing.assert_close(loaded.coarse(probs), table.coarse(probs))
    nnz = loaded.group_members.numel()
    assert loaded.nbytes() == 4 * ((loaded.num_groups + 1) + nnz + 71 + nnz + 70)  # int32 CSR x2 + seeds
