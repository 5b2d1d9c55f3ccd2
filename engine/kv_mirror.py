"""Each running sequence's K/V kept once more, contiguous per row, so attention reads it in place.

The gather + SDPA backend copies every row's blocks out of the paged pool before each attention call: at
batch 12 on CPU that copy was a fifth of a decode step, as much memory traffic as attention itself. The
mirror keeps, per layer, K and V as [rows, positions, H_kv, D], one row per sequence: a forward writes its
new K/V into the pool (the source of truth: prefix sharing, roll-back, preemption) and into the mirror,
and attends over a view of the mirror's first `span` rows. A sequence keeps its row while it runs: one that
joins takes the lowest free row (its blocks gathered from the pool once); when one finishes, the highest
row moves into its place (one row copied); rows of the span that are not in this forward (a stream sitting
a step out) are attended by a dummy query whose output is dropped, which costs less than moving rows
around them. Batch rows in another order than mirror rows cost a permutation of q and the output.

Why it stays exact: a row is keyed by its `SeqBlocks.uid` (a new one on every `release`), and every K/V
position a row reads below its first query position was either gathered from the pool when the row joined
or written through the mirror since (positions from its first query on are written in this forward before
attention). A forward without `states` writes the pool only, so the runner empties the mirror; prefill
chunks write the pool only and the runner marks their rows for gathering again (`forget`); captured graphs
write the pool only, so a runner with captured graphs has no mirror (eager CPU decoding is where it pays).
`mirrored` per row is the end of what the mirror holds; a row whose forward starts past it is gathered
again.

Memory: 2 x layers x rows x capacity x H_kv x D elements, bounded by `max_bytes`; a forward that would need
more runs through the gather path and the mirror is emptied.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pcgtts.engine.block_manager import SeqBlocks


@dataclass
class MirrorBatch:
    """What one forward's attention needs from the mirror. Batch row b lives in mirror row rows[b];
    attention runs over mirror rows [0, span)."""

    mirror: KVMirror
    write_slots: torch.Tensor  # Long[B*T] flat index into a layer's [allocated rows * (capacity + 1)]
    rows: torch.Tensor | None  # Long[B] mirror row of each batch row; None when it is 0..B-1 = span
    span: int
    # [span, 1, T, ctx], bool or additive like PagedBatch.mask, when rows is not None (holes see key 0 only)
    mask: torch.Tensor | None

    def store(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(K, V of layer i as [rows * (capacity + 1), H_kv, D], the flat slot of each new token): where a
        forward writes its new K/V besides the pool (engine/ops/rope_kv.py), rounded as the pool rounds them;
        padding tokens go to the scratch column."""
        return self.mirror.flat_keys[i], self.mirror.flat_values[i], self.write_slots

    def layer(self, i: int, context_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views K, V [span, ctx, H_kv, D] of layer i."""
        rows = slice(0, self.span)
        return self.mirror.keys[i][rows, :context_len], self.mirror.values[i][rows, :context_len]

    def spread(self, q: torch.Tensor) -> torch.Tensor:
        """q [B, ...] -> [span, ...] at the batch rows' mirror rows (zeros in holes)."""
        if self.rows is None:
            return q
        return q.new_zeros((self.span, *q.shape[1:])).index_copy_(0, self.rows, q)

    def collect(self, out: torch.Tensor) -> torch.Tensor:
        """[span, ...] -> the batch rows' [B, ...]."""
        return out if self.rows is None else out.index_select(0, self.rows)


class KVMirror:
    """Per runner: contiguous per-row K/V of the sequences it runs (see module docstring)."""

    KEEP_IDLE = 16  # forwards a row may sit out (a deferred stream) before its row may be given away

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, block_size: int,
                 device: torch.device, dtype: torch.dtype, max_bytes: int):
        self.num_layers, self.kv_shape = num_layers, (num_kv_heads, head_dim)
        self.block_size, self.device, self.dtype = block_size, device, dtype
        self.max_bytes = max_bytes
        self.clear()

    def clear(self) -> None:
        self.capacity = 0  # positions per row; column `capacity` is scratch (padding tokens write there)
        self.uids: list[int | None] = []  # row -> SeqBlocks.uid (None: free)
        self.states: list[SeqBlocks | None] = []  # row -> its state (released when its uid moved on)
        self.mirrored: list[int] = []  # row -> positions [0, mirrored) hold the pool's K/V
        self.last_used: list[int] = []  # row -> forward counter when it last ran
        self.forwards = 0
        self.keys: list[torch.Tensor] = []  # per layer [allocated rows, capacity + 1, H_kv, D]
        self.values: list[torch.Tensor] = []
        self.flat_keys: list[torch.Tensor] = []  # the same storage as [rows * (capacity + 1), H_kv, D]
        self.flat_values: list[torch.Tensor] = []

    def forget(self, states: list[SeqBlocks]) -> None:
        """These rows' pool K/V is being written around the mirror: gather them again when they return."""
        gone = {st.uid for st in states}
        self.mirrored = [0 if u in gone else m for u, m in zip(self.uids, self.mirrored, strict=True)]

    def _bytes(self, rows: int, capacity: int) -> int:
        h, d = self.kv_shape
        return 2 * self.num_layers * rows * (capacity + 1) * h * d * torch.finfo(self.dtype).bits // 8

    def prepare(self, states: list[SeqBlocks], positions: list[list[int]], valid: list[list[bool]],
                tables: torch.Tensor, mask: torch.Tensor, pool_keys: list[torch.Tensor],
                pool_values: list[torch.Tensor]) -> MirrorBatch | None:
        """Give every row of this forward its mirror row (gathering joiners from the pool via `tables`
        Long[B, M]) and return the forward's write index and attention layout; None when the mirror would
        exceed `max_bytes` (the forward gathers instead). positions / valid: its [B][T] query positions and
        which of them are real tokens; mask: its attention mask [B, 1, T, ctx] (PagedBatch.mask, bool or
        additive), None when attention reads the rows' own keys (no mask spread over the span)."""
        self.forwards += 1
        starts, ends = [], []
        for pos, ok in zip(positions, valid, strict=True):
            real = [p for p, v in zip(pos, ok, strict=True) if v]
            starts.append(real[0] if real else 0)
            ends.append(real[-1] + 1 if real else 0)
        ctx = tables.shape[1] * self.block_size
        rows = self._assign(states)
        need = max(ctx, max(ends))
        capacity = self.capacity if need <= self.capacity else max(need, self.capacity * 3 // 2, 256)
        if self._bytes(len(self.uids), capacity) > self.max_bytes:
            self.clear()
            return None
        self._reserve(capacity)
        # rows that joined, or whose positions below their first query were written around the mirror
        stale = [b for b in range(len(states)) if starts[b] > self.mirrored[rows[b]]]
        if stale:
            self._gather_rows([rows[b] for b in stale], tables[stale], pool_keys, pool_values)
        for b, r in enumerate(rows):
            self.mirrored[r] = ends[b]  # later positions (rejected drafts) are no longer the pool's
            self.last_used[r] = self.forwards
        width = self.capacity + 1
        slots = [r * width + (p if ok else self.capacity)
                 for r, pos, oks in zip(rows, positions, valid, strict=True)
                 for p, ok in zip(pos, oks, strict=True)]
        write_slots = torch.tensor(slots, dtype=torch.long, device=self.device)
        span = max(rows) + 1
        if rows == list(range(span)):
            return MirrorBatch(self, write_slots, None, span, None)
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        if mask is None:  # the rows' own attention (engine/ops/row_attention.py) reads rows, not a mask
            return MirrorBatch(self, write_slots, index, span, None)
        additive = mask.dtype != torch.bool
        spread_mask = mask.new_full((span, *mask.shape[1:]), float("-inf") if additive else False)
        # a hole's dummy query sees one key, so its (dropped) softmax stays finite
        spread_mask[..., 0] = 0.0 if additive else True
        spread_mask.index_copy_(0, index, mask)
        return MirrorBatch(self, write_slots, index, span, spread_mask)

    def move(self, state: SeqBlocks, src: int, dst: int, count: int) -> None:
        """Positions [src, src + count) of `state`'s row to [dst, dst + count) (dst < src), where the row is
        held and mirrors them (ModelRunner.move_kv, which moves the pool's too)."""
        if state.uid not in self.uids:
            return
        r = self.uids.index(state.uid)
        if self.mirrored[r] < src + count:  # it does not hold them: gather the row again from dst on
            self.mirrored[r] = min(self.mirrored[r], dst)
            return
        for t in self.keys + self.values:
            t[r, dst:dst + count] = t[r, src:src + count].clone()

    def _free_rows(self, active: set[int]) -> list[int]:
        """Rows that may be given away, ascending: no uid, a released sequence (its uid moved on), or idle
        for more than KEEP_IDLE forwards."""
        return [r for r, (u, st, t) in enumerate(zip(self.uids, self.states, self.last_used, strict=True))
                if u is None or st.uid != u or (u not in active and self.forwards - t > self.KEEP_IDLE)]

    def _assign(self, states: list[SeqBlocks]) -> list[int]:
        """Mirror row of each state: the one it holds, else the lowest free one, else a new one; then the
        highest rows move down into free rows below them, so the span stays the live rows."""
        held = {u: r for r, u in enumerate(self.uids) if u is not None}
        active = {st.uid for st in states}
        free = self._free_rows(active)
        rows = []
        for st in states:
            r = held.get(st.uid)
            if r is None:
                if free:
                    r = free.pop(0)
                else:
                    r = len(self.uids)
                    self.uids.append(None)
                    self.states.append(None)
                    self.mirrored.append(0)
                    self.last_used.append(self.forwards)
                self.uids[r], self.states[r], self.mirrored[r] = st.uid, st, 0
            rows.append(r)
        for r in free:
            self.uids[r] = self.states[r] = None
        while free and free[0] < max(rows):  # a finished row left a hole: fill it with the highest row
            b, dst = rows.index(max(rows)), free.pop(0)
            self._move(rows[b], dst)
            free.append(rows[b])
            rows[b] = dst
        last = max(r for r, u in enumerate(self.uids) if u is not None)
        for column in (self.uids, self.states, self.mirrored, self.last_used):
            del column[last + 1:]  # trailing free rows
        return rows

    def _move(self, src: int, dst: int) -> None:
        """Row src (uid, positions, K/V) to the free row dst < src."""
        n = self.mirrored[src]
        if self.keys and n:
            for t in self.keys + self.values:
                t[dst, :n].copy_(t[src, :n])
        for column in (self.uids, self.states, self.mirrored, self.last_used):
            column[dst] = column[src]
        self.uids[src] = self.states[src] = None

    def _reserve(self, capacity: int) -> None:
        """Storage for len(self.uids) rows of `capacity` positions (grown with headroom, content kept)."""
        allocated = self.keys[0].shape[0] if self.keys else 0
        if capacity == self.capacity and len(self.uids) <= allocated:
            return
        h, d = self.kv_shape
        rows = max(len(self.uids) + len(self.uids) // 2, allocated)  # headroom: a joiner rarely reallocates
        rows = max(len(self.uids), min(rows, self.max_bytes // self._bytes(1, capacity)))
        fresh = [torch.zeros(rows, capacity + 1, h, d, device=self.device, dtype=self.dtype)
                 for _ in range(2 * self.num_layers)]
        if self.keys:
            n = min(allocated, rows)
            for old, new in zip(self.keys + self.values, fresh, strict=True):
                new[:n, :self.capacity].copy_(old[:n, :self.capacity])
        self.keys, self.values = fresh[:self.num_layers], fresh[self.num_layers:]
        self.flat_keys = [t.view(-1, h, d) for t in self.keys]
        self.flat_values = [t.view(-1, h, d) for t in self.values]
        self.capacity = capacity

    def _gather_rows(self, rows: list[int], tables: torch.Tensor, pool_keys: list[torch.Tensor],
                     pool_values: list[torch.Tensor]) -> None:
        """Copy the blocks of `tables` (Long[n, M], one row per mirror row) from the pool into those rows."""
        n, m = tables.shape
        bs, (h, d) = self.block_size, self.kv_shape
        flat_table = tables.reshape(-1)
        for pool, mirror in zip(pool_keys + pool_values, self.keys + self.values, strict=True):
            blocks = pool.view(-1, bs, h, d).index_select(0, flat_table).view(n, m * bs, h, d)
            for i, r in enumerate(rows):
                mirror[r, :m * bs].copy_(blocks[i])
