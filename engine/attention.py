"""Attention over the paged KV cache, behind one small interface.

The model calls `backend.attend(q, k, v, k_cache, v_cache, meta, layer)` for each layer; the backend writes
the new K/V into their cache slots and attends over each sequence's blocks. `PagedBatch` carries what every
layer of one forward shares (slots, gathers, masks), built once per forward from positions and block
tables with tensor ops only (no host syncs), so the same code runs on CPU and CUDA.

Backends:
- `sdpa`: gather each sequence's keys/values block by block (whole blocks are contiguous, so the copy
  runs at memory speed), or read them in place from the runner's KV mirror (engine/kv_mirror.py, CPU
  eager), then `scaled_dot_product_attention` with a per-position causal mask. Works on any device and
  dtype; the default. On the CPU in float32 with the compiled ops, forwards whose metadata carries
  `row_positions` (the runner decides: decode and verify forwards, and every forward under a
  batch-invariance plan) attend each row over its own keys instead (engine/ops/row_attention.py: no
  context padding, no mask, no rows sitting out attended, the same bits in any batch).
- `flash_attn`: flash-attn's paged `flash_attn_with_kvcache` (CUDA, fp16/bf16, block_size a multiple of
  256), opt-in where the `flash_attn` package is installed. Query rows are left-padded by the runner, so
  the kernel's bottom-right causal alignment puts every real query at its own position.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from pcgtts.engine.batch_invariance import attend, causal_mask, pad_rows
from pcgtts.engine.kv_cache import write_kv
from pcgtts.engine.ops.rope_kv import ROPE_KV, write_new_kv
from pcgtts.engine.ops.row_attention import ROW_ATTENTION

if TYPE_CHECKING:
    from pcgtts.engine.kv_mirror import MirrorBatch
    from pcgtts.engine.model.rope import RotaryEmbedding


@dataclass
class PagedBatch:
    """Per-forward attention metadata, shared by all layers.

    Queries are B rows of T tokens; rows shorter than T are padded (valid = False).
    """

    positions: torch.Tensor  # Long[B, T] logical position of each query token (0 for padding): its rotation
    slot_mapping: torch.Tensor  # Long[B*T] cache slot each new K/V is written to (scratch for padding)
    # key j visible to query t iff j <= its cache index (its position, or `cache_index` for a token tree)
    # and j is outside its gap: Bool[B, 1, T, ctx], or additive (0 visible, -inf hidden) in the model's
    # float dtype (see `build_paged_batch`); None with `row_positions`
    mask: torch.Tensor | None
    context_len: int  # ctx: keys gathered per row (max position in the batch + 1)
    block_tables: torch.Tensor  # Long[B, M]
    block_size: int
    # each row's K/V also held contiguous (engine/kv_mirror.py): attend reads it instead of gathering
    # blocks; None: gather (captured graphs, CUDA, prefill chunks, or over the mirror's memory bound)
    mirror: MirrorBatch | None = None
    # Long[B, T] query cache indices, -1 for padding: attention runs each row over its own keys up to them
    # (engine/ops/row_attention.py; `mask` is then None); None: SDPA over `mask`
    row_positions: torch.Tensor | None = None
    # Long[B, T, 2]: keys [lo, hi) each query does not see (a token tree's other branches); None: no gaps
    gaps: torch.Tensor | None = None
    # Long[N]: flat indices into B*T of the real tokens, when some are padding and the forward runs its
    # residual stream and matrix products over those N rows only (attention still sees [B, T]); None: all
    packed: torch.Tensor | None = None

    @property
    def seq_lens(self) -> torch.Tensor:
        """Long[B]: keys each row attends to (its last query position + 1)."""
        return self.positions.max(dim=1).values + 1


@dataclass(frozen=True)
class TreeLayout:
    """Where a token tree's tokens live in their rows' caches. A tree of k branches of γ drafts under the
    last token is laid out as [last token, branch 0, ..., branch k-1] at cache indices n-1 .. n-1+kγ, while
    a branch's j-th draft has position n-1+j (its rotation): each query sees the row's keys up to its own
    cache index except the earlier branches', [n, n + branch·γ), its gap. A chain is the one-branch tree
    (no gaps), so a branch's tokens compute what the same tokens would as a chain."""

    cache_index: torch.Tensor  # Long[B, T]
    gaps: torch.Tensor  # Long[B, T, 2]: keys [lo, hi) hidden from each query (lo == hi: none)

    @classmethod
    def of(cls, lengths: torch.Tensor, branches: int, gamma: int) -> tuple[TreeLayout, torch.Tensor]:
        """(the layout, positions Long[B, 1 + kγ]) of k branches of γ drafts over rows of `lengths`
        (Long[B]: each row's tokens, the last one included)."""
        col = torch.arange(1 + branches * gamma, device=lengths.device)
        branch = (col - 1).clamp(min=0) // gamma  # [T]: column 0 (the last token) in branch 0
        depth = torch.where(col > 0, (col - 1) % gamma + 1, 0)  # [T]
        start = lengths[:, None]  # [B, 1]: cache index of every branch's first draft is start + branch·γ
        positions = start - 1 + depth[None, :]
        lo = start.expand(-1, col.shape[0])
        gaps = torch.stack([lo, lo + (branch * gamma)[None, :]], dim=-1)
        return cls(cache_index=start - 1 + col[None, :], gaps=gaps), positions


def cache_slots(block_tables: torch.Tensor, index: torch.Tensor, block_size: int) -> torch.Tensor:
    """The pool slot of each cache index: block_tables Long[B, M], index Long[B, T] -> Long[B, T]."""
    return torch.gather(block_tables, 1, index // block_size) * block_size + index % block_size


def build_paged_batch(positions: torch.Tensor, valid: torch.Tensor, block_tables: torch.Tensor,
                      block_size: int, scratch_block: int,
                      mask_dtype: torch.dtype = torch.bool, query_quantum: int = 1,
                      row_attention: bool = False, tree: TreeLayout | None = None) -> PagedBatch:
    """positions Long[B, T], valid Bool[B, T], block_tables Long[B, M] padded with `scratch_block`.

    M * block_size must cover every valid position; context length is taken from M (the caller sizes M to
    the batch's longest row), so no host sync is needed. mask_dtype: bool, or a float dtype for an additive
    mask (torch's CPU attention kernel adds a float mask as it goes but first converts a bool one, per
    layer: 6-18% of an attention call at decode sizes here). query_quantum: the mask gets rows for T
    rounded up to a multiple of it (padding queries that see key 0 only), and attention pads the queries
    to match (engine/batch_invariance.py). row_attention: no mask; the rows' own attention reads
    `row_positions` instead. tree: a token tree's cache indices and gaps (its tokens share positions, so
    where their K/V lives is not their position); None: each token's K/V at its position."""
    index = positions if tree is None else tree.cache_index
    row_positions = torch.where(valid, index, torch.full_like(index, -1)) if row_attention else None
    positions = torch.where(valid, positions, torch.zeros_like(positions))
    index = torch.where(valid, index, torch.zeros_like(index))
    slot = cache_slots(block_tables, index, block_size)
    slot = torch.where(valid, slot, torch.full_like(slot, scratch_block * block_size))
    ctx = block_tables.shape[1] * block_size
    gaps = None if tree is None else tree.gaps
    mask = None
    if not row_attention:
        padded_gaps = None if gaps is None else pad_rows(gaps.transpose(0, 1), query_quantum).transpose(0, 1)
        mask = causal_mask(pad_rows(index.T, query_quantum).T, ctx, mask_dtype, padded_gaps)
    return PagedBatch(positions=positions, slot_mapping=slot.reshape(-1), mask=mask, context_len=ctx,
                      block_tables=block_tables, block_size=block_size, row_positions=row_positions,
                      gaps=gaps)


def pad_query_rows(mask: torch.Tensor, quantum: int) -> torch.Tensor:
    """mask [B, 1, T, ctx] with rows for padding queries (key 0 visible only) up to a multiple of
    `quantum` queries."""
    short = -mask.shape[2] % quantum
    if not short:
        return mask
    pad = torch.zeros_like(mask[:, :, :1]) if mask.dtype == torch.bool else \
        torch.full_like(mask[:, :, :1], float("-inf"))
    pad[..., 0] = True if mask.dtype == torch.bool else 0.0
    return torch.cat([mask, pad.expand(-1, -1, short, -1)], dim=2)


def gather_blocks(cache: torch.Tensor, meta: PagedBatch) -> torch.Tensor:
    """Each row's keys (or values) in logical order: cache [S, H_kv, D] -> [B, ctx, H_kv, D]."""
    b, m = meta.block_tables.shape
    blocks = cache.view(-1, meta.block_size, *cache.shape[1:])  # [num_blocks + 1, bs, H_kv, D]
    return blocks.index_select(0, meta.block_tables.reshape(-1)).view(b, meta.context_len, *cache.shape[1:])


class AttentionBackend(ABC):
    name: str

    @abstractmethod
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor, meta: PagedBatch, layer: int) -> torch.Tensor:
        """q [B, T, H, D], k/v [B, T, H_kv, D] (new tokens), caches [S, H_kv, D] of `layer` -> out
        [B, T, H * D]."""

    def fuses_rope(self, meta: PagedBatch) -> bool:
        """Whether this forward's layers may hand their unrotated q/k/v to `attend_unrotated` (the backend
        rotates them as it writes the K/V: one compiled loop on the CPU's rows path) rather than rotate them
        and call `attend`."""
        return False

    def attend_unrotated(self, qkv: torch.Tensor, rope: RotaryEmbedding, heads: int, kv_heads: int,
                         k_cache: torch.Tensor, v_cache: torch.Tensor, meta: PagedBatch,
                         layer: int) -> torch.Tensor:
        """`attend` from the fused projection's output qkv [B, T, (H + 2 H_kv) D], q and k heads not yet
        rotated (interleaved pairs, rope.py), where `fuses_rope` says so -> out [B, T, H * D]."""
        raise NotImplementedError


class GatherSDPABackend(AttentionBackend):
    name = "sdpa"

    def fuses_rope(self, meta: PagedBatch) -> bool:
        return meta.row_positions is not None

    def attend_unrotated(self, qkv, rope, heads, kv_heads, k_cache, v_cache, meta, layer):
        b, t = meta.positions.shape
        n = b * t
        mirror = meta.mirror
        q = ROPE_KV.compiled(qkv.view(n, qkv.shape[-1]), rope, meta.positions.view(n), heads, kv_heads,
                             k_cache, v_cache, meta.slot_mapping,
                             *(mirror.store(layer) if mirror is not None else (None, None, None)))
        return self._rows_attention(q.view(b, t, heads, q.shape[-1]), k_cache, v_cache, meta, layer)

    def _rows_attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        meta: PagedBatch, layer: int) -> torch.Tensor:
        """Each row's queries q [B, T, H, D] over its own keys, read in place (the mirror's, or gathered
        blocks), this forward's K/V already written -> [B, T, H * D]."""
        b, t, h, d = q.shape
        mirror = meta.mirror
        if mirror is None:
            keys, values, rows = gather_blocks(k_cache, meta), gather_blocks(v_cache, meta), None
        else:
            keys, values, rows = mirror.mirror.keys[layer], mirror.mirror.values[layer], mirror.rows
        rows = torch.arange(b, device=q.device) if rows is None else rows
        return ROW_ATTENTION.compiled(q, keys, values, rows, meta.row_positions, meta.gaps).view(b, t, h * d)

    def attend(self, q, k, v, k_cache, v_cache, meta, layer):
        b, t, h, d = q.shape
        mirror = meta.mirror
        # the new K/V into the pool and, for mirrored rows, the mirror
        write_new_kv(k.reshape(b * t, *k.shape[2:]), v.reshape(b * t, *v.shape[2:]), k_cache, v_cache,
                     meta.slot_mapping, *(mirror.store(layer) if mirror is not None else (None, None, None)))
        if meta.row_positions is not None:  # each row over its own keys, read in place
            return self._rows_attention(q, k_cache, v_cache, meta, layer)
        if mirror is None:  # (an fp16 K/V store widened to q's dtype: a prefill chunk over gathered blocks)
            keys, values = (gather_blocks(c, meta).to(q.dtype) for c in (k_cache, v_cache))
            mask = meta.mask
        else:  # over the mirror's rows [0, span): this forward's rows and, between them, holes
            keys, values = mirror.layer(layer, meta.context_len)  # views [span, ctx, H_kv, D]
            q, mask = mirror.spread(q), meta.mask if mirror.mask is None else mirror.mask
        if mask.shape[2] > t:  # queries padded as the mask says (engine/batch_invariance.py)
            q = F.pad(q, (0, 0, 0, 0, 0, mask.shape[2] - t))
        out = attend(q, keys, values, mask)[:, :, :t]  # [R, H, T, D]
        if mirror is not None:
            out = mirror.collect(out)  # [B, H, T, D]
        return out.transpose(1, 2).reshape(b, t, h * d)


class FlashAttnBackend(AttentionBackend):
    """flash-attn's paged decode/prefill kernel over the same cache layout (no gather)."""

    name = "flash_attn"

    def __init__(self):
        from flash_attn import flash_attn_with_kvcache  # optional dependency

        self._kernel = flash_attn_with_kvcache

    def attend(self, q, k, v, k_cache, v_cache, meta, layer):
        if meta.gaps is not None:
            raise ValueError("flash_attn has no token-tree attention; use the sdpa backend")
        b, t, h, d = q.shape
        h_kv = k.shape[2]
        write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
        bs = meta.block_size
        out = self._kernel(q, k_cache.view(-1, bs, h_kv, d), v_cache.view(-1, bs, h_kv, d),
                           cache_seqlens=meta.seq_lens.to(torch.int32),
                           block_table=meta.block_tables.to(torch.int32), causal=True)  # [B, T, H, D]
        return out.reshape(b, t, h * d)


BACKENDS = {"sdpa": GatherSDPABackend, "flash_attn": FlashAttnBackend}


def make_backend(name: str, device: torch.device | str, dtype: torch.dtype | None = None,
                 block_size: int | None = None) -> AttentionBackend:
    """`auto` is the gather + SDPA backend everywhere (the one the test suite checks on CPU)."""
    if name == "auto":
        name = "sdpa"
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose from {sorted(BACKENDS)}")
    if name == "flash_attn":
        if torch.device(device).type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
            raise ValueError("flash_attn needs CUDA and float16/bfloat16")
        if block_size is None or block_size % 256:
            raise ValueError("flash_attn's paged KV needs block_size to be a multiple of 256")
    return BACKENDS[name]()
