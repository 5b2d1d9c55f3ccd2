"""Build ASGs from an embedding table: G(t) = {t' : cos(e_t, e_t') >= θ}, identical groups merged.

The same builder makes acoustic groups from any [V, D] matrix under `metric="l2"`: G(t) = {t' :
||e_t - e_t'|| <= θ}, e.g. the codec's centroids (log-mel frames), θ a distance in their units.

Blockwise: each block of `block_rows` rows is compared with the whole table in one matmul, thresholded, and
kept only as a CSR slice, so peak memory is the float32 table plus one [block_rows, V] similarity block plus
the groups themselves (a 65,536 x 2,048 table with 1,024-row blocks: 512 MiB + 256 MiB + the CSR).
"""

from __future__ import annotations

import time

import torch
from pcgtts.asg_tables.csr import gather_segments, lengths_to_indptr
from pcgtts.asg_tables.table import ASGTable
from tqdm import tqdm

DEFAULT_BLOCK_ROWS = 1024


def normalized_rows(embeddings: torch.Tensor, device: torch.device | str | None = None) -> torch.Tensor:
    """Float32 rows scaled to unit L2 norm (zero rows stay zero and then match nothing but themselves)."""
    e = embeddings.to(device=device or embeddings.device, dtype=torch.float32)
    return e / e.norm(dim=1, keepdim=True).clamp_min(1e-12)


def similarity_blocks(unit: torch.Tensor, block_rows: int, progress: bool, desc: str,
                      metric: str = "cosine"):
    """Yield (start, closeness[start:start+block_rows, :]) blocks of the closeness matrix of rows [V, D]."""
    for start in tqdm(range(0, unit.shape[0], block_rows), desc=desc, unit="block", disable=not progress):
        yield start, closeness(unit[start : start + block_rows], unit, metric)  # [b, V]


METRICS = ("cosine", "l2")


def prepared_rows(embeddings: torch.Tensor, metric: str,
                  device: torch.device | str | None = None) -> torch.Tensor:
    """Rows as the metric compares them: unit rows for cosine, float32 rows for l2."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose from {METRICS}")
    if metric == "cosine":
        return normalized_rows(embeddings, device)
    return embeddings.to(device=device or embeddings.device, dtype=torch.float32)


def closeness(a: torch.Tensor, b: torch.Tensor, metric: str) -> torch.Tensor:
    """[n, D] x [m, D] -> [n, m], larger = closer: cosine of unit rows, or minus the L2 distance."""
    return a @ b.T if metric == "cosine" else -torch.cdist(a, b)


def upper_similarity_blocks(unit: torch.Tensor, block_rows: int, progress: bool, desc: str,
                            metric: str = "cosine"):
    """Yield (start, closeness[start:start+block_rows, start:]): the upper triangle by row blocks, about half
    the work of the full matrix. Work per block shrinks, so the progress bar speeds up towards the end."""
    for start in tqdm(range(0, unit.shape[0], block_rows), desc=desc, unit="block", disable=not progress):
        yield start, closeness(unit[start : start + block_rows], unit[start:], metric)  # [b, V - start]


def seed_groups(
    unit: torch.Tensor, theta: float, block_rows: int, progress: bool, metric: str = "cosine"
) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR (indptr Long[V+1], members Int32[nnz]) of G(t) for every row t, each containing t.

    Both metrics are symmetric, so only the upper triangle is computed and each pair above the diagonal
    block is recorded in both directions (which also makes the relation exactly symmetric under rounding)."""
    v = unit.shape[0]
    rows_out, cols_out = [], []
    bound = theta if metric == "cosine" else -theta  # closeness >= bound
    for start, sim in upper_similarity_blocks(unit, block_rows, progress, f"ASG θ={theta:g}", metric):
        b = sim.shape[0]
        local = torch.arange(b, device=sim.device)
        mask = sim >= bound
        mask[local, local] = True  # t ∈ G(t) whatever rounding does to cos(e_t, e_t)
        i, j = mask.nonzero().unbind(1)  # the diagonal block [b, b] holds both directions already
        del sim, mask
        r, c = (i + start).to(torch.int32), (j + start).to(torch.int32)
        beyond = j >= b
        rows_out += [r, c[beyond]]
        cols_out += [c, r[beyond]]
    rows, cols = torch.cat(rows_out), torch.cat(cols_out)
    del rows_out, cols_out
    order = torch.sort(rows.long() * v + cols.long()).indices  # row-major, members sorted within a row
    indptr = lengths_to_indptr(torch.bincount(rows.long(), minlength=v))
    return indptr, cols[order]


def dedupe(indptr: torch.Tensor, members: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge identical member lists.

    Returns (group_of_row Long[V] with groups numbered by first occurrence, representative row of each
    group Long[M]). Rows are keyed by (length, two random-weight sums); equal keys are then compared
    exactly."""
    v, device = indptr.shape[0] - 1, members.device
    gen = torch.Generator().manual_seed(0)
    lengths = indptr[1:] - indptr[:-1]
    row_of = torch.repeat_interleave(torch.arange(v, device=device), lengths, output_size=members.shape[0])
    keys = [lengths]
    for _ in range(2):
        weights = torch.randint(0, 1 << 40, (v,), generator=gen).to(device)  # sums stay far below 2^63
        keys.append(
            torch.zeros(v, dtype=torch.long, device=device).index_add_(0, row_of, weights[members.long()])
        )
    _, inverse = torch.unique(torch.stack(keys, dim=1), dim=0, return_inverse=True)
    first = torch.full((int(inverse.max()) + 1,), v, dtype=torch.long, device=device)
    first.scatter_reduce_(0, inverse, torch.arange(v, device=device), reduce="amin")
    rep_of_row = first[inverse]  # Long[V]: first row with the same key
    dup = torch.nonzero(rep_of_row != torch.arange(v, device=device)).flatten()
    if dup.numel():
        _, a = gather_segments(indptr, members, dup)
        _, b = gather_segments(indptr, members, rep_of_row[dup])
        if not torch.equal(a, b):  # a hash collision: astronomically unlikely, handled exactly anyway
            return _dedupe_exact(indptr, members)
    # number groups by their first row
    reps = torch.nonzero(rep_of_row == torch.arange(v, device=device)).flatten()  # sorted
    group_of_rep = torch.full((v,), -1, dtype=torch.long, device=device)
    group_of_rep[reps] = torch.arange(reps.shape[0], device=device)
    return group_of_rep[rep_of_row], reps


def _dedupe_exact(indptr: torch.Tensor, members: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    index: dict[bytes, int] = {}
    group_of_row, reps = [], []
    ip, mem = indptr.tolist(), members.cpu().numpy()
    for r in range(len(ip) - 1):
        key = mem[ip[r] : ip[r + 1]].tobytes()
        if key not in index:
            index[key] = len(reps)
            reps.append(r)
        group_of_row.append(index[key])
    return torch.tensor(group_of_row, device=members.device), torch.tensor(reps, device=members.device)


def build_asg(
    embeddings: torch.Tensor,
    theta: float,
    *,
    offset: int = 0,
    vocab_size: int | None = None,
    block_rows: int = DEFAULT_BLOCK_ROWS,
    device: torch.device | str | None = None,
    progress: bool = True,
    meta: dict | None = None,
    metric: str = "cosine",
) -> ASGTable:
    """ASG table over tokens [offset, offset + V) of a vocabulary of `vocab_size` (default offset + V).

    embeddings: [V, D] rows of those tokens (any float dtype). Tokens outside the range are singletons,
    numbered after the speech groups. Group ids of speech groups follow their first seed token.
    metric: "cosine" (G(t) = cos >= θ, the paper's) or "l2" (G(t) = distance <= θ)."""
    started = time.perf_counter()
    n = embeddings.shape[0]
    vocab_size = offset + n if vocab_size is None else int(vocab_size)
    if offset < 0 or offset + n > vocab_size:
        raise ValueError(f"token range [{offset}, {offset + n}) outside vocabulary of {vocab_size}")
    unit = prepared_rows(embeddings, metric, device)
    indptr, members = seed_groups(unit, theta, block_rows, progress, metric)
    del unit
    group_of_row, reps = dedupe(indptr, members)
    # speech groups: the representative rows' member lists, shifted to vocabulary ids
    seg, rep_members = gather_segments(indptr, members, reps)
    g_lengths = indptr[reps + 1] - indptr[reps]
    outside = torch.cat([torch.arange(0, offset), torch.arange(offset + n, vocab_size)]).to(members.device)
    g_indptr = lengths_to_indptr(torch.cat([g_lengths, torch.ones_like(outside)]))
    g_members = torch.cat([rep_members.long() + offset, outside])
    seed_group = torch.empty(vocab_size, dtype=torch.long, device=members.device)
    seed_group[offset : offset + n] = group_of_row
    seed_group[outside] = reps.shape[0] + torch.arange(outside.shape[0], device=members.device)
    seed_sizes = (indptr[1:] - indptr[:-1]).double()
    info = {
        "theta": float(theta),
        "metric": metric,
        "offset": int(offset),
        "num_tokens": int(n),
        "vocab_size": vocab_size,
        "embedding_dim": int(embeddings.shape[1]),
        "num_speech_groups": int(reps.shape[0]),
        "mean_seed_group_size": float(seed_sizes.mean()),
        "max_seed_group_size": int(seed_sizes.max()),
        "mean_group_size": float(g_lengths.double().mean()),
        "build_seconds": round(time.perf_counter() - started, 3),
    }
    table = ASGTable(vocab_size, g_indptr, g_members, seed_group=seed_group, meta={**info, **(meta or {})})
    return table


def seed_group_sizes(
    embeddings: torch.Tensor,
    thetas: list[float],
    *,
    block_rows: int = DEFAULT_BLOCK_ROWS,
    device: torch.device | str | None = None,
    progress: bool = True,
    metric: str = "cosine",
) -> torch.Tensor:
    """|G(t)| for every row and every θ in one pass over the similarity matrix: Long[len(thetas), V].

    A cheap preview for choosing θ (groups are not materialised or merged)."""
    unit = prepared_rows(embeddings, metric, device)
    sign = 1.0 if metric == "cosine" else -1.0
    out = []
    for start, sim in similarity_blocks(unit, block_rows, progress, "θ sweep", metric):
        rows = torch.arange(sim.shape[0], device=sim.device)
        sim[rows, rows + start] = float("inf")  # t ∈ G(t)
        out.append(torch.stack([(sim >= sign * th).sum(dim=1) for th in thetas]))
    return torch.cat(out, dim=1).cpu()
