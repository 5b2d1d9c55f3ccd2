"""Automatic prefix caching for the paged KV: full blocks of prompt tokens shared between sequences.

Every request for one voice starts with the same tokens (the speaker's reference codes), so their K/V
are computed once and reused. As in vLLM's automatic prefix caching and nano-vllm, a *full* block of
prompt tokens is keyed by a hash of its tokens chained with its parent block's hash, so a key names the
whole prefix up to that block's end. A cached block is read-only: nothing writes a position that is not
past a sequence's computed prefix, and only blocks lying entirely inside the computed prompt are cached.
Blocks are reference-counted; a cached block nobody holds stays in an LRU list, reusable by the next
matching prompt until the allocator needs its memory for something else (least recently used first).
Pinned keys (preset voices) keep one reference of their own once computed, so they are never evicted.
Pins may be marked `lru` (uploaded voices): when the pin budget is full, the least recently pinned of
those gives its blocks back (they stay cached, evictable) so that a newer one can be pinned.
"""

from __future__ import annotations

import hashlib
from collections import Counter, OrderedDict

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
        self.pinned_keys: Counter[bytes] = Counter()  # key -> pins naming it (prefixes share leading keys)
        self.pinned_blocks: set[int] = set()
        self.max_pinned_blocks = max_pinned_blocks
        self.pins: OrderedDict[bytes, tuple[list[bytes], bool]] = OrderedDict()  # last key -> (keys, lru)

    def pin(self, keys: list[bytes], lru: bool) -> None:
        """Pin a prefix's block keys (again: it becomes the most recently pinned)."""
        if not keys:
            return
        if keys[-1] in self.pins:
            self.pins.move_to_end(keys[-1])
            return
        self.pins[keys[-1]] = (keys, lru)
        self.pinned_keys.update(keys)
        for key in keys:  # blocks already cached (e.g. a voice pinned again while its blocks were kept)
            if (block := self.block_of.get(key)) is not None:
                self._pin_block(block, key)

    def unpin(self, last_key: bytes) -> None:
        """Drop one pin: keys no other pin names stop being pinned, their blocks lose the pin's reference."""
        keys, _ = self.pins.pop(last_key)
        for key in keys:
            self.pinned_keys[key] -= 1
            if self.pinned_keys[key] > 0:
                continue
            del self.pinned_keys[key]
            block = self.block_of.get(key)
            if block is not None and block in self.pinned_blocks:
                self.pinned_blocks.discard(block)
                self.ref_count[block] -= 1
                if self.ref_count[block] == 0:
                    self.evictable[block] = None

    def _room_for_pin(self, key: bytes) -> bool:
        """Whether one more block may be pinned, unpinning least recently pinned `lru` pins (not one that
        names `key`) while the budget is full."""
        while len(self.pinned_blocks) >= self.max_pinned_blocks:
            victim = next((last for last, (keys, lru) in self.pins.items() if lru and key not in keys), None)
            if victim is None:
                return False
            self.unpin(victim)
        return True

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
        if key in self.pinned_keys:
            self._pin_block(block, key)

    def _pin_block(self, block: int, key: bytes) -> None:
        """Give a cached block of a pinned key the pin's own reference, if the budget allows."""
        if block in self.pinned_blocks or not self._room_for_pin(key):
            return
        if self.ref_count[block] == 0:
            del self.evictable[block]
        self.pinned_blocks.add(block)
        self.ref_count[block] += 1

    def evict_lru(self) -> int | None:
        """Forget the least recently used unreferenced cached block and return it (None if there is none)."""
        if not self.evictable:
            return None
        block, _ = self.evictable.popitem(last=False)
        del self.block_of[self.key_of.pop(block)]
        return block
