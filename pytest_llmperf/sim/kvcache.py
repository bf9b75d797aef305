"""The KV block pool with prefix caching, reduced to counts and hashes.

No tensors exist, so a block is only bookkeeping: a sequence holds some *anonymous* blocks
(partial blocks, generated tokens, duplicates) and references to *cached* blocks named by the
hash of the tokens they hold (chained over the preceding blocks, as vLLM does): prompt blocks,
and blocks of generated tokens once computed, so a follow-up turn that sends the answer back hits. A cached
block whose reference count drops to zero stays reusable until it is evicted, least recently
freed first.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from pytest_llmperf.errors import InputError

if TYPE_CHECKING:
    from collections.abc import Sequence


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids`` (a trailing partial block is not hashed)."""
    out: list[int] = []
    prev = 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        prev = hash((prev, tuple(token_ids[start : start + block_size])))
        out.append(prev)
    return out


class BlockPool:
    """Counts of free, anonymous and cached blocks; LRU eviction of unreferenced cached blocks."""

    __slots__ = ("num_blocks", "anon_used", "_refcount", "_evictable")

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise InputError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self.anon_used = 0
        self._refcount: dict[int, int] = {}
        # Insertion order is eviction order: the dict is the LRU queue.
        self._evictable: OrderedDict[int, None] = OrderedDict()

    @property
    def free_blocks(self) -> int:
        """Blocks obtainable right now: never used, or cached but unreferenced (evictable)."""
        return self.num_blocks - self.anon_used - (len(self._refcount) - len(self._evictable))

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self.free_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks held by running sequences (vLLM's kv_cache_usage_perc)."""
        return self.used_blocks / self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._refcount)

    def count_hits(self, hashes: Sequence[int], max_blocks: int) -> tuple[int, int]:
        """(leading blocks found in the cache, how many of those are unreferenced)."""
        hits = idle = 0
        refcount = self._refcount
        for h in hashes[:max_blocks]:
            rc = refcount.get(h)
            if rc is None:
                break
            hits += 1
            if rc == 0:
                idle += 1
        return hits, idle

    def take_hits(self, hashes: Sequence[int], count: int, refs: list[int]) -> None:
        """Reference the first ``count`` cached blocks (found by :meth:`count_hits`)."""
        refcount, evictable = self._refcount, self._evictable
        for h in hashes[:count]:
            rc = refcount[h]
            if rc == 0:
                del evictable[h]
            refcount[h] = rc + 1
            refs.append(h)

    def allocate(self, count: int) -> None:
        """Take ``count`` anonymous blocks, evicting cached ones if needed (caller checked room)."""
        clean = self.num_blocks - self.anon_used - len(self._refcount)
        if clean < count:
            evictable, refcount = self._evictable, self._refcount
            for _ in range(count - clean):
                h, _ = evictable.popitem(last=False)
                del refcount[h]
        self.anon_used += count

    def register(self, h: int) -> bool:
        """Turn one anonymous block of the caller into the cached block ``h``.

        False when ``h`` is cached already (another sequence computed the same block meanwhile):
        the caller's copy stays anonymous, as a duplicate does in vLLM.
        """
        if h in self._refcount:
            return False
        self._refcount[h] = 1
        self.anon_used -= 1
        return True

    def release(self, anon_blocks: int, refs: list[int]) -> None:
        """Give back a sequence's blocks. Tail blocks are queued for eviction first (vLLM order)."""
        self.anon_used -= anon_blocks
        refcount, evictable = self._refcount, self._evictable
        for h in reversed(refs):
            rc = refcount[h] - 1
            refcount[h] = rc
            if rc == 0:
                evictable[h] = None
        refs.clear()
