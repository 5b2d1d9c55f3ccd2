"""build_asg on constructed embeddings, against groups worked out by hand and a brute-force reference."""

from __future__ import annotations

import math

import torch
from pcgtts.asg_tables import build_asg
from pcgtts.asg_tables.build import seed_group_sizes


def unit_circle(degrees: list[float], scales: list[float] | None = None) -> torch.Tensor:
    scales = scales or [1.0] * len(degrees)
    return torch.tensor([[s * math.cos(math.radians(d)), s * math.sin(math.radians(d))]
                         for d, s in zip(degrees, scales, strict=True)])


def all_groups(table) -> list[list[int]]:
    return [table.members(k).tolist() for k in range(table.num_groups)]


def test_hand_worked_groups_with_offset_and_duplicates():
    # θ = cos 45°: neighbours are the vectors within 45 degrees. Rows 5 and 6 point the same way (with
    # different lengths), so G(5) = G(6) and the two merge. Rows are tokens 2..8 of a vocabulary of 10.
    emb = unit_circle([0, 30, 60, 120, 180, 270, 270], scales=[1, 2, 0.5, 1, 3, 1, 7])
    table = build_asg(emb, math.cos(math.radians(45)), offset=2, vocab_size=10, progress=False)
    assert table.vocab_size == 10
    assert all_groups(table) == [[2, 3], [2, 3, 4], [3, 4], [5], [6], [7, 8], [0], [1], [9]]
    assert table.num_groups == 9
    assert table.groups_of(3).tolist() == [0, 1, 2] and table.groups_of(7).tolist() == [5]
    assert table.num_owners.tolist() == [1, 1, 2, 3, 2, 1, 1, 1, 1, 1]
    # the seed group of each token is G(t) itself
    assert table.seed_group.tolist() == [6, 7, 0, 1, 2, 3, 4, 5, 5, 8]
    assert table.meta["num_speech_groups"] == 6 and table.meta["theta"] == math.cos(math.radians(45))


def test_matches_brute_force_for_any_block_size():
    gen = torch.Generator().manual_seed(0)
    centres = torch.randn(6, 16, generator=gen)
    emb = centres[torch.randint(0, 6, (300,), generator=gen)] + 0.6 * torch.randn(300, 16, generator=gen)
    unit = emb / emb.norm(dim=1, keepdim=True)
    cos = unit @ unit.T
    theta = 0.8
    expected: list[list[int]] = []
    for t in range(300):
        members = sorted(set(torch.nonzero(cos[t] >= theta).flatten().tolist()) | {t})
        if members not in expected:
            expected.append(members)
    for block_rows in (7, 64, 1024):
        table = build_asg(emb, theta, block_rows=block_rows, progress=False)
        assert all_groups(table) == expected
    sizes = torch.tensor([len(g) for g in expected])
    assert 1 < float(sizes.double().mean()) < 100  # the construction really has overlapping groups


def test_theta_sweep_counts_seed_groups():
    gen = torch.Generator().manual_seed(1)
    emb = torch.randn(200, 8, generator=gen)
    thetas = [0.9, 0.5, 0.2]
    sizes = seed_group_sizes(emb, thetas, block_rows=50, progress=False)
    for i, theta in enumerate(thetas):
        table = build_asg(emb, theta, progress=False)
        per_token = table.group_sizes()[table.seed_group.long()]
        assert torch.equal(sizes[i], per_token)
    assert bool((sizes[0] <= sizes[1]).all() and (sizes[1] <= sizes[2]).all())


def test_l2_metric_groups_by_distance_against_brute_force():
    # acoustic groups (e.g. codec centroids): G(t) = {t' : ||e_t - e_t'|| <= θ}; row lengths matter here
    gen = torch.Generator().manual_seed(2)
    emb = torch.randn(150, 5, generator=gen) * torch.rand(150, 1, generator=gen) * 3
    dist = torch.cdist(emb, emb)
    radius = float(dist.median()) / 3
    expected: list[list[int]] = []
    for t in range(150):
        members = sorted(set(torch.nonzero(dist[t] <= radius).flatten().tolist()) | {t})
        if members not in expected:
            expected.append(members)
    for block_rows in (11, 1024):
        table = build_asg(emb, radius, block_rows=block_rows, progress=False, metric="l2")
        assert all_groups(table) == expected
        assert table.meta["metric"] == "l2"
    sizes = seed_group_sizes(emb, [radius, 2 * radius], block_rows=40, progress=False, metric="l2")
    table = build_asg(emb, radius, progress=False, metric="l2")
    assert torch.equal(sizes[0], table.group_sizes()[table.seed_group.long()])
    assert bool((sizes[0] <= sizes[1]).all()) and float(sizes[0].double().mean()) > 1.5
