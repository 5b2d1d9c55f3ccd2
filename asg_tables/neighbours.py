"""Per-token neighbour lists (nearest first) for neighbourhood rules such as LANTERN.

A NeighbourIndex covers tokens [offset, offset + n) of the vocabulary: ids Long[n, k] of vocabulary tokens,
padded with -1. Tokens outside the range have no neighbours.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pcgtts.asg_tables.build import DEFAULT_BLOCK_ROWS, normalized_rows, similarity_blocks
from pcgtts.asg_tables.csr import gather_segments
from pcgtts.asg_tables.table import ASGTable


@dataclass
class NeighbourIndex:
    ids: torch.Tensor  # [n, k] vocabulary ids, -1 padded, nearest first where an order is known
    offset: int = 0

    def __post_init__(self):
        self.ids = self.ids.to(torch.int32)  # 65,536 x 1,000 neighbours: 262 MB rather than 524 MB

    @property
    def k(self) -> int:
        return self.ids.shape[1]

    def to(self, device: torch.device | str) -> NeighbourIndex:
        return NeighbourIndex(self.ids.to(device), self.offset)

    def of(self, tokens: torch.Tensor) -> torch.Tensor:
        """Neighbours of each token: Long[*tokens.shape, k], -1 where none."""
        local = tokens - self.offset
        inside = (local >= 0) & (local < self.ids.shape[0])
        rows = self.ids[local.clamp(0, self.ids.shape[0] - 1)].long()
        return torch.where(inside.unsqueeze(-1), rows, -1)


def nearest_neighbours(
    embeddings: torch.Tensor,
    k: int,
    *,
    offset: int = 0,
    block_rows: int = DEFAULT_BLOCK_ROWS,
    device: torch.device | str | None = None,
    progress: bool = False,
) -> NeighbourIndex:
    """The k most cosine-similar other rows of each row of embeddings [n, D], nearest first."""
    n = embeddings.shape[0]
    k = min(k, n - 1)
    unit = normalized_rows(embeddings, device)
    out = []
    for start, sim in similarity_blocks(unit, block_rows, progress, "neighbours"):
        rows = torch.arange(sim.shape[0], device=sim.device)
        sim[rows, rows + start] = float("-inf")  # a token is not its own neighbour
        out.append(torch.topk(sim, k, dim=1).indices)
    return NeighbourIndex(torch.cat(out) + offset, offset)


def neighbours_from_table(table: ASGTable, k: int) -> NeighbourIndex:
    """Neighbours of t = the other members of G(t) (its seed group; the first group holding t for tables
    without seeds), in token order since a table records no distances; at most k of them."""
    start = int(table.meta.get("offset", 0))
    n = int(table.meta.get("num_tokens", table.vocab_size - start))
    tokens = torch.arange(start, start + n, device=table.device)
    index = table.index()
    if table.seed_group is not None:
        groups = table.seed_group.long()[tokens]
    else:
        groups = index.token_groups[index.token_indptr[tokens]]
    seg, members = gather_segments(index.group_indptr, index.group_members, groups)
    keep = members != tokens[seg]
    seg, members = seg[keep], members[keep]
    # rank of each kept member within its token's list
    counts = torch.bincount(seg, minlength=n)
    rank = torch.arange(seg.shape[0], device=seg.device) - (torch.cumsum(counts, 0) - counts)[seg]
    width = max(1, min(k, int(counts.max()) if counts.numel() else 1))
    ids = torch.full((n, width), -1, dtype=torch.long, device=table.device)
    fits = rank < width
    ids[seg[fits], rank[fits]] = members[fits]
    return NeighbourIndex(ids, start)
