"""Paged KV bookkeeping: a pool of fixed-size blocks and per-sequence block tables.

A sequence's K/V for logical position j lives in block `table[j // block_size]` at offset
`j % block_size`. Blocks are taken on demand, given back when a sequence finishes, is aborted or
preempted, and trailing blocks are given back when speculative positions are rolled back.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class OutOfBlocks(Exception):
    """The pool cannot satisfy an allocation (the scheduler preempts and retries)."""


class BlockAllocator:
    """A free list over block ids [0, num_blocks)."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1:
            raise ValueError("the KV budget must hold at least one block")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Popping from the end hands out low ids first, which keeps small runs cache-friendly.
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def take(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfBlocks(f"need {n} blocks, {len(self._free)} free")
        taken = self._free[len(self._free) - n:]
        del self._free[len(self._free) - n:]
        return taken[::-1]

    def give_back(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))


@dataclass
class SeqBlocks:
    """One sequence's KV state in one model's cache."""

    blocks: list[int] = field(default_factory=list)  # block table: logical block -> physical block
    num_computed: int = 0  # tokens whose K/V are in the cache and valid (a prefix of the sequence)

    def ensure(self, allocator: BlockAllocator, num_tokens: int) -> None:
        """Make room for positions [0, num_tokens); all or nothing."""
        missing = allocator.blocks_for(num_tokens) - len(self.blocks)
        if missing > 0:
            self.blocks.extend(allocator.take(missing))

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
