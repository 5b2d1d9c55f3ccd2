"""Paged KV bookkeeping: a pool of fixed-size blocks and per-sequence block tables.

A sequence's K/V for logical position j lives in block `table[j // block_size]` at offset
`j % block_size`. Blocks are taken on demand, given back when a sequence finishes, is aborted or
preempted, and trailing blocks are given back when speculative positions are rolled back.

Blocks are reference-counted: full blocks of prompt tokens may be shared between sequences through the
pool's prefix cache (engine.prefix_cache), and a shared block is read-only. A block whose count drops to
zero goes back to the free list, or, when it is cached, to the cache's LRU list, from which it is
reclaimed only when the free list is empty.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from pcgtts.engine.prefix_cache import PrefixCache, prefix_hashes


class OutOfBlocks(Exception):
    """The pool cannot satisfy an allocation (the scheduler preempts and retries)."""


class BlockAllocator:
    """A free list over block ids [0, num_blocks), with reference counts and a prefix cache."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True,
                 max_pinned_fraction: float = 0.25):
        if num_blocks < 1:
            raise ValueError("the KV budget must hold at least one block")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.cache = PrefixCache(num_blocks, int(num_blocks * max_pinned_fraction))
        # Popping from the end hands out low ids first, which keeps small runs cache-friendly.
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        """Blocks an allocation can get: free, or cached but held by nobody (evicted on demand)."""
        return len(self._free) + len(self.cache.evictable)

    @property
    def num_used(self) -> int:
        """Blocks some sequence (or a pin) holds."""
        return self.num_blocks - self.num_free

    @property
    def num_held(self) -> int:
        """Blocks requests hold (used, less those kept by pins alone)."""
        return self.num_used - len(self.cache.pinned_blocks) + sum(
            1 for b in self.cache.pinned_blocks if self.cache.ref_count[b] > 1)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def take(self, n: int) -> list[int]:
        if n > self.num_free:
            raise OutOfBlocks(f"need {n} blocks, {self.num_free} free")
        taken = []
        for _ in range(n):
            block = self._free.pop() if self._free else self.cache.evict_lru()
            self.cache.ref_count[block] = 1
            taken.append(block)
        return taken

    def give_back(self, blocks: list[int]) -> None:
        """Drop one reference to each block (in reverse, so a table's tail is the least recently used)."""
        refs = self.cache.ref_count
        for block in reversed(blocks):
            refs[block] -= 1
            assert refs[block] >= 0, f"block {block} given back more often than taken"
            if refs[block] == 0:
                if self.cache.is_cached(block):
                    self.cache.evictable[block] = None
                else:
                    self._free.append(block)

    # ---- prefix cache ---------------------------------------------------------------------------------
    def share_prefix(self, token_ids: list[int], max_tokens: int) -> list[int]:
        """Take a reference to the cached blocks of the longest cached full-block prefix of
        token_ids[:max_tokens]; returns them (logical order)."""
        if not self.prefix_caching:
            return []
        keys = prefix_hashes(token_ids, self.block_size, max(0, max_tokens) // self.block_size)
        blocks = self.cache.lookup(keys)
        for block in blocks:
            if self.cache.ref_count[block] == 0:
                del self.cache.evictable[block]
            self.cache.ref_count[block] += 1
        return blocks

    def cache_prefix(self, blocks: list[int], token_ids: list[int], num_tokens: int) -> None:
        """Register the full blocks among the first `num_tokens` (computed, committed) tokens."""
        if not self.prefix_caching:
            return
        full = min(num_tokens // self.block_size, len(blocks))
        for block, key in zip(blocks[:full], prefix_hashes(token_ids, self.block_size, full), strict=True):
            self.cache.register(block, key)

    def pin(self, token_ids: list[int], lru: bool = False) -> None:
        """Keep the full blocks of this prefix cached for good once a request has computed them; `lru`:
        until newer lru pins need the pin budget (PrefixCache)."""
        n = len(token_ids) // self.block_size
        self.cache.pin(prefix_hashes(token_ids, self.block_size, n), lru)


_STATE_UIDS = itertools.count()


@dataclass
class SeqBlocks:
    """One sequence's KV state in one model's cache."""

    blocks: list[int] = field(default_factory=list)  # block table: logical block -> physical block
    num_computed: int = 0  # tokens whose K/V are in the cache and valid (a prefix of the sequence)
    # identity of this state's K/V since it was last released (engine/kv_mirror.py keys rows by it)
    uid: int = field(default_factory=lambda: next(_STATE_UIDS))

    def ensure(self, allocator: BlockAllocator, num_tokens: int) -> None:
        """Make room for positions [0, num_tokens); all or nothing."""
        missing = allocator.blocks_for(num_tokens) - len(self.blocks)
        if missing > 0:
            self.blocks.extend(allocator.take(missing))

    def share_prefix(self, allocator: BlockAllocator, token_ids: list[int], max_tokens: int) -> int:
        """On an empty state: start from the cached blocks of the prompt's prefix; returns tokens reused."""
        assert not self.blocks and self.num_computed == 0
        self.blocks = allocator.share_prefix(token_ids, max_tokens)
        self.num_computed = len(self.blocks) * allocator.block_size
        return self.num_computed

    def cache_prefix(self, allocator: BlockAllocator, token_ids: list[int], prompt_len: int) -> None:
        allocator.cache_prefix(self.blocks, token_ids, min(self.num_computed, prompt_len))

    def roll_back(self, allocator: BlockAllocator, num_valid: int) -> None:
        """Keep K/V of the first `num_valid` tokens; free blocks holding only later positions."""
        self.num_computed = min(self.num_computed, num_valid)
        keep = allocator.blocks_for(self.num_computed)
        if keep < len(self.blocks):
            allocator.give_back(self.blocks[keep:])
            del self.blocks[keep:]

    def release(self, allocator: BlockAllocator) -> None:
        allocator.give_back(self.blocks)
        self.blocks = []
        self.num_computed = 0
        self.uid = next(_STATE_UIDS)
