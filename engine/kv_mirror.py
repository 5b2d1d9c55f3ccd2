"""Each running sequence's K/V kept once more, contiguous and in batch order, so attention reads it in place.

The gather + SDPA backend copies every row's blocks out of the paged pool before each attention call: at
batch 12 on CPU that copy was a fifth of a decode step, as much memory traffic as attention itself. The
mirror keeps, per layer, K and V as [rows, positions, H_kv, D] with row b of the current forward at row b:
a forward writes its new K/V into the pool (the source of truth: prefix sharing, roll-back, preemption) and
into the mirror, and attends over a view of the mirror. Rows are copied only when the batch changes (a row
joins: its blocks are gathered from the pool once; rows leave or move: the moved rows are copied).

Why it stays exact: a row is keyed by its `SeqBlocks.uid` (a new one on every `release`), and every K/V
position a row reads below its first query position was either gathered from the pool when the row joined
or written through the mirror since (positions from its first query on are written in this forward before
attention). A forward without `states` writes the pool only, so the runner empties the mirror; captured
graphs write the pool only, so a runner with captured graphs has no mirror (eager CPU decoding is where it
pays). `mirrored` per row is the end of what the mirror holds; a row whose forward starts past it is
gathered again.

Memory: 2 x layers x rows x capacity x H_kv x D elements, bounded by `max_bytes`; a forward that would need
more runs through the gather path and the mirror is emptied.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.block_manager import SeqBlocks


@dataclass
class MirrorBatch:
    """What one forward's attention needs from the mirror."""

    mirror: KVMirror
    write_slots: torch.Tensor  # Long[B*T] flat index into a layer's [rows * (capacity + 1)] positions
    rows: int  # B: the forward's rows are mirror rows 0..B-1

    def layer(self, i: int, context_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views K, V [B, ctx, H_kv, D] of layer i."""
        rows = slice(0, self.rows)
        return self.mirror.keys[i][rows, :context_len], self.mirror.values[i][rows, :context_len]

    def write(self, i: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """New k/v [B, T, H_kv, D] of layer i into their mirror positions (padding: the scratch column)."""
        b, t, h_kv, d = k.shape
        self.mirror.flat_keys[i].index_put_((self.write_slots,), k.reshape(b * t, h_kv, d))
        self.mirror.flat_values[i].index_put_((self.write_slots,), v.reshape(b * t, h_kv, d))


class KVMirror:
    """Per runner: contiguous per-row K/V of the sequences it ran last (see module docstring)."""

    KEEP_IDLE = 64  # forwards a row may sit out (a deferred stream, a prefill batch) before it is dropped

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, block_size: int,
                 device: torch.device, dtype: torch.dtype, max_bytes: int):
        self.num_layers, self.kv_shape = num_layers, (num_kv_heads, head_dim)
        self.block_size, self.device, self.dtype = block_size, device, dtype
        self.max_bytes = max_bytes
        self.capacity = 0  # positions per row; column `capacity` is scratch (padding tokens write there)
        self.uids: list[int] = []  # row -> SeqBlocks.uid
        self.mirrored: list[int] = []  # row -> positions [0, mirrored) hold the pool's K/V
        self.last_used: list[int] = []  # row -> forward counter when it last ran
        self.forwards = 0
        self.keys: list[torch.Tensor] = []  # per layer [R, capacity + 1, H_kv, D]
        self.values: list[torch.Tensor] = []
        self.flat_keys: list[torch.Tensor] = []  # the same storage as [R * (capacity + 1), H_kv, D]
        self.flat_values: list[torch.Tensor] = []

    def _bytes(self, rows: int, capacity: int) -> int:
        h, d = self.kv_shape
        return 2 * self.num_layers * rows * (capacity + 1) * h * d * torch.finfo(self.dtype).bits // 8

    def clear(self) -> None:
        self.capacity = 0
        self.uids, self.mirrored, self.last_used = [], [], []
        self.keys, self.values, self.flat_keys, self.flat_values = [], [], [], []

    def prepare(self, states: list[SeqBlocks], positions: list[list[int]], valid: list[list[bool]],
                tables: torch.Tensor, pool_keys: list[torch.Tensor], pool_values: list[torch.Tensor]
                ) -> MirrorBatch | None:
        """Arrange rows 0..B-1 as `states` (gathering joiners from the pool via `tables` Long[B, M]) and
        return the forward's write index; None when the mirror would exceed `max_bytes` (gather instead).
        positions / valid: the forward's [B][T] query positions and which are real tokens."""
        self.forwards += 1
        b = len(states)
        starts, ends = [], []
        for pos, ok in zip(positions, valid, strict=True):
            real = [p for p, v in zip(pos, ok, strict=True) if v]
            starts.append(real[0] if real else 0)
            ends.append(real[-1] + 1 if real else 0)
        uids = [st.uid for st in states]
        active = set(uids)
        idle = [u for u, t in zip(self.uids, self.last_used, strict=True)
                if u not in active and self.forwards - t <= self.KEEP_IDLE]
        need = max(tables.shape[1] * self.block_size, max(ends))
        capacity = self.capacity if need <= self.capacity else max(need, self.capacity * 3 // 2, 256)
        if self._bytes(b + len(idle), capacity) > self.max_bytes:
            idle = []  # drop idle rows first, then give up for this forward
            if self._bytes(b, capacity) > self.max_bytes:
                self.clear()
                return None
        self._arrange(uids + idle, capacity)
        # rows that joined, or whose positions below their first query were written around the mirror
        stale = [r for r in range(b) if starts[r] > self.mirrored[r]]
        if stale:
            self._gather_rows(stale, tables, pool_keys, pool_values)
        for r in range(b):
            self.mirrored[r] = ends[r]  # later positions (rejected drafts) are no longer the pool's
            self.last_used[r] = self.forwards
        width = self.capacity + 1
        slots = [r * width + (p if ok else self.capacity)
                 for r, (pos, oks) in enumerate(zip(positions, valid, strict=True))
                 for p, ok in zip(pos, oks, strict=True)]
        return MirrorBatch(self, torch.tensor(slots, dtype=torch.long, device=self.device), b)

    def _arrange(self, order: list[int], capacity: int) -> None:
        """Rows ordered as `order` (uids) in storage of at least len(order) x `capacity`: rows already held
        are copied to their new place (only those that move), new ones start empty (mirrored = 0)."""
        held = {u: r for r, u in enumerate(self.uids)}
        src = [held.get(u, -1) for u in order]
        allocated = self.keys[0].shape[0] if self.keys else 0
        if capacity != self.capacity or len(order) > allocated:
            h, d = self.kv_shape
            rows = max(len(order) + len(order) // 2, allocated)  # headroom: a joining row rarely reallocates
            rows = max(len(order), min(rows, self.max_bytes // self._bytes(1, capacity)))
            fresh = [torch.zeros(rows, capacity + 1, h, d, device=self.device, dtype=self.dtype)
                     for _ in range(2 * self.num_layers)]
            moved = [(dst, s) for dst, s in enumerate(src) if s >= 0]
            cols = max((self.mirrored[s] for _, s in moved), default=0)  # what the moved rows hold
            if cols:
                dst_idx, src_idx = (torch.tensor(x, device=self.device) for x in zip(*moved, strict=True))
                for old, new in zip(self.keys + self.values, fresh, strict=True):
                    new[dst_idx, :cols] = old[src_idx, :cols]
            self.keys, self.values = fresh[:self.num_layers], fresh[self.num_layers:]
            self.flat_keys = [t.view(-1, h, d) for t in self.keys]
            self.flat_values = [t.view(-1, h, d) for t in self.values]
            self.capacity = capacity
        else:
            moved = [(dst, s) for dst, s in enumerate(src) if s >= 0 and s != dst]
            cols = max((self.mirrored[s] for _, s in moved), default=0)
            if cols:
                dst_idx, src_idx = (torch.tensor(x, device=self.device) for x in zip(*moved, strict=True))
                for t in self.keys + self.values:
                    # the right side is read into a copy first: overlapping moves are safe
                    t[dst_idx, :cols] = t[src_idx, :cols]
        mirrored = dict(zip(self.uids, self.mirrored, strict=True))
        used = dict(zip(self.uids, self.last_used, strict=True))
        self.uids = order
        self.mirrored = [mirrored.get(u, 0) for u in order]
        self.last_used = [used.get(u, self.forwards) for u in order]

    def _gather_rows(self, rows: list[int], tables: torch.Tensor, pool_keys: list[torch.Tensor],
                     pool_values: list[torch.Tensor]) -> None:
        """Copy the blocks of `tables[rows]` (Long[B, M]) from the pool into those mirror rows."""
        idx = torch.tensor(rows, device=self.device)
        flat_table = tables.index_select(0, idx).reshape(-1)
        n, m = len(rows), tables.shape[1]
        bs, (h, d) = self.block_size, self.kv_shape
        for pool, mirror in zip(pool_keys + pool_values, self.keys + self.values, strict=True):
            blocks = pool.view(-1, bs, h, d).index_select(0, flat_table)  # [n*M, bs, H_kv, D]
            mirror[idx, :m * bs] = blocks.view(n, m * bs, h, d)
