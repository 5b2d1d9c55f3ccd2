"""ASGTable: Acoustic Similarity Groups in compact CSR form, and the coarse-graining they define.

Storage (all int32, so a 65,536-token table with mean group size 140 is ~37 MB per direction):
  group_indptr  [M+1], group_members [nnz]  group k -> its member tokens (sorted)
  token_indptr  [V+1], token_groups  [nnz]  token t -> the groups S(t) holding it (sorted)
  seed_group    [V] (optional)             the group that is G(t) itself, for tables made by build_asg
Weights are the paper's equal split, w_{k,t} = 1/N(t) with N(t) = |S(t)|, so for any distribution p
    P_c(G_k) = Σ_{t ∈ G_k} p(t) / N(t)    and    Σ_k P_c(G_k) = 1.
Saved as one safetensors file; JSON metadata (θ, source, stats, ...) sits in the safetensors header.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import NamedTuple

import torch
from pcgtts.asg_tables.csr import gather_segments, lengths_to_indptr, transpose
from safetensors import safe_open
from safetensors.torch import save_file

FORMAT = "pcgtts-asg/1"
_TENSORS = ("group_indptr", "group_members", "token_indptr", "token_groups")


class TableIndex(NamedTuple):
    """A table's two CSR indexes as Long tensors: group k's members are
    group_members[group_indptr[k]:group_indptr[k+1]], token t's groups token_groups[token_indptr[t]:...]."""

    group_indptr: torch.Tensor  # Long[M+1]
    group_members: torch.Tensor  # Long[nnz]
    token_indptr: torch.Tensor  # Long[V+1]
    token_groups: torch.Tensor  # Long[nnz]


class ASGTable:
    def __init__(
        self,
        vocab_size: int,
        group_indptr: torch.Tensor,
        group_members: torch.Tensor,
        token_indptr: torch.Tensor | None = None,
        token_groups: torch.Tensor | None = None,
        seed_group: torch.Tensor | None = None,
        meta: dict | None = None,
    ):
        self.vocab_size = int(vocab_size)
        self.group_indptr = group_indptr.to(torch.int32)
        self.group_members = group_members.to(torch.int32)
        if token_indptr is None or token_groups is None:
            t_indptr, t_groups = transpose(
                self.group_indptr.long(), self.group_members.long(), self.vocab_size
            )
            token_indptr, token_groups = t_indptr, t_groups
        self.token_indptr = token_indptr.to(torch.int32)
        self.token_groups = token_groups.to(torch.int32)
        self.seed_group = None if seed_group is None else seed_group.to(torch.int32)
        self.meta = dict(meta or {})
        if self.token_indptr.shape[0] != self.vocab_size + 1:
            raise ValueError("token_indptr does not match vocab_size")
        # int64 working copies for indexing, and the equal-split weight 1/N(t) per token.
        self._g_indptr = self.group_indptr.long()
        self._g_members = self.group_members.long()
        self._t_indptr = self.token_indptr.long()
        self._t_groups = self.token_groups.long()
        self.num_owners = self._t_indptr[1:] - self._t_indptr[:-1]  # N(t): Long[V]
        if bool((self.num_owners == 0).any()):
            raise ValueError("every token must belong to at least one group")
        self.inv_owners = 1.0 / self.num_owners.double()  # w_{k,t} = 1/N(t): Float64[V]
        self._coarse_matrix: torch.Tensor | None = None

    # ---- construction -------------------------------------------------------------------------------
    @classmethod
    def from_groups(cls, groups: list[list[int]], vocab_size: int, meta: dict | None = None) -> ASGTable:
        """Explicit groups; members are sorted and deduplicated, identical groups kept once (first wins),
        and tokens named in no group become singleton groups appended in token order."""
        seen: set[tuple[int, ...]] = set()
        distinct: list[tuple[int, ...]] = []
        for g in groups:
            members = tuple(sorted(set(int(t) for t in g)))
            if not members:
                raise ValueError("empty group")
            if members[0] < 0 or members[-1] >= vocab_size:
                raise ValueError(f"group {list(members)[:8]} has tokens outside [0, {vocab_size})")
            if members not in seen:
                seen.add(members)
                distinct.append(members)
        covered = torch.zeros(vocab_size, dtype=torch.bool)
        for members in distinct:
            covered[list(members)] = True
        distinct += [(int(t),) for t in torch.nonzero(~covered).flatten().tolist()]
        lengths = torch.tensor([len(m) for m in distinct], dtype=torch.long)
        flat = torch.tensor([t for m in distinct for t in m], dtype=torch.long)
        return cls(vocab_size, lengths_to_indptr(lengths), flat, meta=meta)

    # ---- queries ------------------------------------------------------------------------------------
    @property
    def num_groups(self) -> int:
        return self.group_indptr.shape[0] - 1

    @property
    def device(self) -> torch.device:
        return self.group_members.device

    def members(self, k: int) -> torch.Tensor:
        return self._g_members[self._g_indptr[k] : self._g_indptr[k + 1]]

    def groups_of(self, t: int) -> torch.Tensor:
        return self._t_groups[self._t_indptr[t] : self._t_indptr[t + 1]]

    def index(self) -> TableIndex:
        """Both CSR indexes as Long tensors on the table's device (what a loop over the groups reads)."""
        return TableIndex(self._g_indptr, self._g_members, self._t_indptr, self._t_groups)

    def group_sizes(self) -> torch.Tensor:  # Long[M]
        return self._g_indptr[1:] - self._g_indptr[:-1]

    def to(self, device: torch.device | str) -> ASGTable:
        return ASGTable(
            self.vocab_size,
            self.group_indptr.to(device),
            self.group_members.to(device),
            self.token_indptr.to(device),
            self.token_groups.to(device),
            None if self.seed_group is None else self.seed_group.to(device),
            self.meta,
        )

    def nbytes(self) -> int:
        stored = [getattr(self, n) for n in _TENSORS] + (
            [self.seed_group] if self.seed_group is not None else []
        )
        return sum(t.numel() * t.element_size() for t in stored)

    # ---- the coarse-grained distribution ------------------------------------------------------------
    def coarse(self, probs: torch.Tensor, method: str = "sparse") -> torch.Tensor:
        """P_c(G_k) = Σ_{t ∈ G_k} p(t)/N(t) for every group: [..., V] -> [..., M], in one sparse product.

        method "sparse": a CSR matrix W[M, V] times probsᵀ; "index_add": scatter-add over the nnz entries
        (bench/verify_speed.py compares the two)."""
        if probs.shape[-1] != self.vocab_size:
            raise ValueError(f"probs have {probs.shape[-1]} entries, the table {self.vocab_size}")
        lead = probs.shape[:-1]
        flat = probs.reshape(-1, self.vocab_size)  # [R, V]
        dtype = flat.dtype if flat.dtype in (torch.float32, torch.float64) else torch.float32
        if method == "sparse":
            out = (self._coarse_weights(dtype) @ flat.to(dtype).T).T  # [R, M]
        elif method == "index_add":
            group_of_entry = torch.repeat_interleave(
                torch.arange(self.num_groups, device=self.device),
                self.group_sizes(),
                output_size=self._g_members.shape[0],
            )
            weighted = flat.to(dtype)[:, self._g_members] * self.inv_owners[self._g_members].to(dtype)
            out = torch.zeros(flat.shape[0], self.num_groups, dtype=dtype, device=flat.device)
            out.index_add_(1, group_of_entry, weighted)
        else:
            raise ValueError(f"unknown coarse method {method!r}")
        return out.reshape(*lead, self.num_groups)

    def _coarse_weights(self, dtype: torch.dtype) -> torch.Tensor:
        """Sparse CSR W[M, V] with W[k, t] = 1/N(t) for t ∈ G_k (cached per dtype of last use)."""
        w = self._coarse_matrix
        if w is None or w.dtype != dtype:
            values = self.inv_owners[self._g_members].to(dtype)
            with warnings.catch_warnings():  # "sparse CSR support is in beta"
                warnings.simplefilter("ignore", UserWarning)
                w = torch.sparse_csr_tensor(
                    self._g_indptr,
                    self._g_members,
                    values,
                    size=(self.num_groups, self.vocab_size),
                    check_invariants=False,
                )
            self._coarse_matrix = w
        return w

    def group_mass(
        self, probs: torch.Tensor, rows: tuple[torch.Tensor, ...], groups: torch.Tensor
    ) -> torch.Tensor:
        """Σ_{t ∈ G_k} probs[row][t] / N(t) for R (row, k) pairs -> Float64[R].

        probs: [..., V]; rows: one Long[R] index per leading dimension; groups: Long[R]. Costs O(Σ|G_k|)."""
        seg, members = gather_segments(self._g_indptr, self._g_members, groups)
        # one flat gather (torch.take); advanced indexing with several index tensors is several times slower
        row = torch.zeros_like(groups)
        for dim, r in enumerate(rows):
            row = row * probs.shape[dim] + r
        vals = torch.take(probs, row[seg] * self.vocab_size + members).double() * self.inv_owners[members]
        return torch.zeros(groups.shape[0], dtype=torch.float64, device=groups.device).index_add_(
            0, seg, vals
        )

    def draw_label(self, tokens: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K ~ w_{·,t} (uniform over S(t) under the equal split) per token, from uniforms u shaped like tokens
        (Float64): K is the ⌊u·N(t)⌋-th group of S(t). Returns (K, the fractional part of u·N(t)), the latter
        again uniform on [0, 1) and independent of K, so one uniform serves a label and a test (with N(t) = 1
        it is u itself)."""
        n = torch.take(self.num_owners, tokens)
        scaled = u * n
        slot = torch.minimum(scaled.floor(), n - 1)  # u·N(t) can round up to N(t)
        pick = torch.take(self._t_indptr, tokens) + slot.long()
        return torch.take(self._t_groups, pick), scaled.sub_(slot)

    def segments(self, groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(segment id, member token) for the members of each group in Long[R] (ragged, concatenated)."""
        return gather_segments(self._g_indptr, self._g_members, groups)

    # ---- storage ------------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        tensors = {n: getattr(self, n).contiguous().cpu() for n in _TENSORS}
        if self.seed_group is not None:
            tensors["seed_group"] = self.seed_group.contiguous().cpu()
        header = {"format": FORMAT, "vocab_size": str(self.vocab_size), "meta": json.dumps(self.meta)}
        save_file(tensors, str(path), metadata=header)

    @classmethod
    def load(cls, path: str | Path, device: torch.device | str = "cpu") -> ASGTable:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            header = f.metadata() or {}
            if header.get("format") != FORMAT:
                raise ValueError(f"{path} is not a {FORMAT} table")
            tensors = {n: f.get_tensor(n) for n in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
        return cls(
            int(header["vocab_size"]),
            tensors["group_indptr"],
            tensors["group_members"],
            tensors["token_indptr"],
            tensors["token_groups"],
            tensors.get("seed_group"),
            json.loads(header.get("meta", "{}")),
        )

    @staticmethod
    def name_of(path: str | Path) -> str:
        """The table's name: the one its build recorded (`meta["name"]`, e.g. "mel-0.35"), else its file's
        stem. Reads the header only."""
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get("meta", "{}"))
        return str(meta.get("name") or Path(path).stem)

    def __repr__(self) -> str:
        return (
            f"ASGTable(vocab_size={self.vocab_size}, num_groups={self.num_groups}, "
            f"nnz={self.group_members.shape[0]}, theta={self.meta.get('theta')})"
        )
