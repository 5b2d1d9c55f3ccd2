"""Batched categorical sampling driven only by an explicit torch.Generator: the one sampler of the engine
(`BatchSampler.sample`, the draft's and the target's draws) and of the acceptance rules.

Inverse-CDF sampling: one uniform per draw, so a seed reproduces the draw, and a zero-probability token
can never be returned (searchsorted(right=True) lands on a strictly rising step of the cumulative sum).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class RowGenerators:
    """Several generators for one batch of rows: `blocks` pairs a generator with the rows (Long[n]) it
    serves. A rule whose every draw is `uniform((rows, ...))` (`AcceptanceRule.row_draws`) then verifies
    the whole batch in one call, and each block's generator yields exactly the numbers it would have
    yielded to a call over that block's rows alone."""

    def __init__(self, blocks: list[tuple[torch.Generator, torch.Tensor]], num_rows: int):
        self.blocks = blocks
        self.num_rows = num_rows

    def rand(self, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
        if shape[0] != self.num_rows:
            raise ValueError(f"a draw of shape {shape} for {self.num_rows} rows of generators")
        out = torch.empty(shape, device=device, dtype=torch.float64)
        for generator, rows in self.blocks:
            out[rows] = torch.rand((rows.shape[0], *shape[1:]), generator=generator, device=device,
                                   dtype=torch.float64)
        return out


def uniform(shape: tuple[int, ...], generator: torch.Generator | RowGenerators | None,
            device: torch.device) -> torch.Tensor:
    """U[0, 1) float64 samples of `shape` on `device` (float64 so that u * total never rounds up to total)."""
    if isinstance(generator, RowGenerators):
        return generator.rand(shape, device)
    return torch.rand(shape, generator=generator, device=device, dtype=torch.float64)


@dataclass(frozen=True)
class VerifyUniforms:
    """Every uniform one verify call uses, drawn in one place and one order, so that the forms of a verify
    (engine/ops/verify.py) and the rules that share its steps draw the same tokens from the same seed.

    accept: Float64[B, γ]  position i's acceptance test (for group rules also its label: draw_label; for the
                           block rules the test of keeping i+1 drafts, block.py)
    emit:   Float64[B]     the emitted token at the first rejection or the bonus slot (group rules: its group)
    token:  Float64[B]     group rules: the token inside the emitted group (None for token-level rules)
    """

    accept: torch.Tensor
    emit: torch.Tensor
    token: torch.Tensor | None = None

    @classmethod
    def draw(cls, generator: torch.Generator | RowGenerators | None, rows: int, gamma: int,
             device: torch.device, in_group: bool = False) -> VerifyUniforms:
        """Draws accept, then emit, then (in_group) token."""
        accept = uniform((rows, gamma), generator, device)
        emit = uniform((rows,), generator, device)
        return cls(accept, emit, uniform((rows,), generator, device) if in_group else None)


BLOCK = 256  # tokens per block of the two-level inverse CDF
# Up to this many categories one float64 cumulative sum per row is cheaper than the two levels (about 20 small
# ops, which cost more than one cumulative sum of this length; beyond it the float64 copy of every row costs
# more). Chosen by the row length alone, never by the row count: the two searches round differently, and a
# row's draw must not depend on its batch mates.
SINGLE_PASS_MAX_V = 8192


def sample_rows(
    weights: torch.Tensor, generator: torch.Generator | None, u: torch.Tensor | None = None
) -> torch.Tensor:
    """Indices drawn ∝ the unnormalised nonnegative `weights` [R, V] of each row.

    u: uniforms Float64[R] (one draw per row, the default) or [R, T] (T independent draws per row); the
    result is Long with u's shape. Two levels keep the cost at one summing pass over V: pick a block of
    BLOCK tokens from the block totals, then a token inside it from that block's own cumulative sum (a
    full [R, V] float64 cumsum is several times slower on CPU). Rows whose weights are all zero return
    some index; callers make sure this never matters."""
    r, v = weights.shape
    if u is None:
        u = uniform((r,), generator, weights.device)
    single = u.dim() == 1
    u = u.reshape(r, -1)  # [R, T]
    if v <= SINGLE_PASS_MAX_V:  # one cumulative sum beats gathering blocks per draw
        cdf = torch.cumsum(weights, dim=-1, dtype=torch.float64)  # [R, V]
        idx = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)
        # u * total rounding up to the total lands past the last positive weight (idx == V, the only way
        # idx can miss one): take that token. On CPU testing for it costs fewer ops than always fixing it;
        # elsewhere the fix-up avoids a host sync.
        if weights.device.type != "cpu" or bool((idx >= v).any()):
            last_positive = (torch.arange(v, device=weights.device) * (weights > 0)).argmax(-1, keepdim=True)
            idx = torch.minimum(idx, last_positive)
        return idx.squeeze(1) if single else idx
    full = (v // BLOCK) * BLOCK
    # Block totals in the weights' own precision (sum(dtype=float64) would first copy all of V to float64);
    # only the short cumulative sums run in float64.
    sums = [weights[:, :full].reshape(r, -1, BLOCK).sum(-1)]  # [R, nb]
    if full < v:
        sums.append(weights[:, full:].sum(-1, keepdim=True))
    block_cdf = torch.cumsum(torch.cat(sums, dim=1).double(), dim=1)  # [R, nb(+1)]
    target = u * block_cdf[:, -1:]  # [R, T]
    block = torch.searchsorted(block_cdf, target, right=True).clamp_(max=block_cdf.shape[1] - 1)
    before = torch.where(block > 0, torch.gather(block_cdf, 1, (block - 1).clamp(min=0)), 0.0)
    # the chosen blocks' weights: [R, T, BLOCK], positions past V masked to zero
    pos = block.unsqueeze(-1) * BLOCK + torch.arange(BLOCK, device=weights.device)
    inside = pos < v
    w = torch.gather(weights, 1, pos.clamp(max=v - 1).flatten(1)).view(pos.shape).double() * inside
    inner_cdf = torch.cumsum(w, dim=-1)
    inner = torch.searchsorted(inner_cdf, (target - before).unsqueeze(-1), right=True).squeeze(-1)
    # rounding can leave the target at or past the block's own total: take its last positive token then
    last_positive = (torch.arange(BLOCK, device=weights.device) * (w > 0)).argmax(-1)
    inner = torch.where(inner >= BLOCK, last_positive, torch.minimum(inner, last_positive))
    idx = block * BLOCK + inner
    return idx.squeeze(1) if single else idx


def sample_segments(
    weights: torch.Tensor,
    indptr: torch.Tensor,
    generator: torch.Generator | None,
    u: torch.Tensor | None = None,
) -> torch.Tensor:
    """One position per segment of a ragged array: segment r is weights[indptr[r]:indptr[r+1]].

    weights: [L] nonnegative; indptr: Long[R+1]; returns Long[R] absolute positions into `weights`.
    Every segment must be non-empty with a positive total. Each segment is searched by a cumulative sum of
    its own (as rows of one zero-padded matrix), so a segment's draw does not depend on the others'."""
    starts, lengths = indptr[:-1], indptr[1:] - indptr[:-1]
    cols = torch.arange(int(lengths.max()), device=weights.device)
    inside = cols[None, :] < lengths[:, None]  # [R, longest]
    rows = torch.where(inside, weights[(starts[:, None] + cols[None, :]).clamp(max=weights.shape[0] - 1)], 0)
    return starts + sample_rows(rows, generator, u)
