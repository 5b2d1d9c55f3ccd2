"""Small helpers for ragged int arrays in CSR form (indptr [R+1], values [nnz])."""

from __future__ import annotations

import torch


def lengths_to_indptr(lengths: torch.Tensor) -> torch.Tensor:
    """Long[R] lengths -> Long[R+1] offsets starting at 0."""
    return torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])


def gather_segments(
    indptr: torch.Tensor, values: torch.Tensor, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate segments `rows` (Long[R]) of a CSR array.

    Returns (segment_id Long[L] in [0, R), gathered values [L]); segment r's entries are contiguous."""
    start, end = indptr[rows], indptr[rows + 1]
    lengths = end - start
    total = int(lengths.sum())
    segment_id = torch.repeat_interleave(
        torch.arange(rows.shape[0], device=rows.device), lengths, output_size=total
    )
    # position of each entry inside its segment: global index minus the segment's start in the output
    out_start = torch.cumsum(lengths, 0) - lengths
    within = torch.arange(total, device=rows.device) - out_start[segment_id]
    return segment_id, values[start[segment_id] + within]


def transpose(
    indptr: torch.Tensor, values: torch.Tensor, num_columns: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR rows->columns into columns->rows (rows sorted within each column)."""
    num_rows = indptr.shape[0] - 1
    row_of = torch.repeat_interleave(
        torch.arange(num_rows, device=values.device), indptr[1:] - indptr[:-1], output_size=values.shape[0]
    )
    order = torch.sort(values, stable=True).indices
    counts = torch.bincount(values, minlength=num_columns)
    return lengths_to_indptr(counts), row_of[order]
