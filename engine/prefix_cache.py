"""Automatic prefix caching for the paged KV: full blocks of prompt tokens shared between sequences.

Every request for one voice starts with the same tokens (the speaker's reference codes), so their K/V
are computed once and reused. As in vLLM's automatic prefix caching and nano-vllm, a *full* block of
prompt tokens is keyed by a hash of its tokens chained with its parent block's hash, so a key names the
whole prefix up to that block's end. A cached block is read-only: nothing writes a position that is not
past a sequence's computed prefix, and only blocks lying entirely inside the computed prompt are cached.
Blocks are reference-counted; a cached block nobody holds stays in an LRU list, reusable by the next
matching prompt until the allocator needs its memory for something else (least recently used first).
Pinned keys (preset voices) keep one reference of their own once computed, so they are never evicted.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

ROOT_HASH = b"pcgtts-prefix-root"


def block_hash(parent: bytes, tokens: list[int] | tuple[int, ...]) -> bytes:
    """Key of a full block: blake2b(parent key, its token ids) -> 16 bytes."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(b"".join(int(t).to_bytes(4, "little", signed=False) for t in tokens))
    return h.digest()


def prefix_hashes(token_ids: list[int], block_size: int, num_blocks: int) -> list[bytes]:
    """Chained keys of the first `num_blocks` full blocks of `token_ids`."""
    keys, parent = [], ROOT_HASH
    for i in range(num_blocks):
        parent = block_hash(parent, token_ids[i * block_size:(i + 1) * block_size])
        keys.append(parent)
    return keys


class PrefixCache:
    """The hash table, reference counts and LRU list of one block pool (see BlockAllocator)."""

    def __init__(self, num_blocks: int, max_pinned_blocks: int):
        self.ref_count = [0] * num_blocks
        self.key_of: dict[int, bytes] = {}  # cached block -> key
        self.block_of: dict[bytes, int] = {}  # key -> cached block
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached blocks nobody holds, LRU first
        self.pinned_keys: set[bytes] = set()
        self.pinned_blocks: set[int] = set()
        self.max_pinned_blocks = max_pinned_blocks

    def is_cached(self, block: int) -> bool:
        return block in self.key_of

    def lookup(self, keys: list[bytes]) -> list[int]:
        """Cached blocks of the longest run of `keys` from the start (not yet referenced)."""
        found = []
        for key in keys:
            block = self.block_of.get(key)
            if block is None:
                break
            found.append(block)
        return found

    def register(self, block: int, key: bytes) -> None:
        """Make a full, computed, held block of a sequence's prompt shareable under `key`. A key already
        cached in another block keeps that one (this block stays private and is freed normally)."""
        if key in self.block_of or block in self.key_of:
            return
        self.key_of[block] = key
        self.block_of[key] = block
        if key in self.pinned_keys and len(self.pinned_blocks) < self.max_pinned_blocks:
            self.pinned_blocks.add(block)
            self.ref_count[block] += 1

    def evict_lru(self) -> int | None:
        """Forget the least recently used unreferenced cached block and return it (None if there is none)."""
        if not self.evictable:
            return None
        block, _ = self.evictable.popitem(last=False)
        del self.block_of[self.key_of.pop(block)]
        return block
