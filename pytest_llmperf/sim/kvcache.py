"""The KV block pool with prefix caching, reduced to counts and hashes.

No tensors exist, so a block is only bookkeeping: a sequence holds some *anonymous* blocks
(partial blocks, generated tokens, duplicates) and references to *cached* blocks named by the
hash of the tokens they hold (chained over the preceding blocks, as vLLM does): prompt blocks,
and blocks of generated tokens once computed, so a follow-up turn that sends the answer back hits. A cached
block whose reference count drops to zero stays reusable until it is evicted, least recently
freed first.

The encoder-output cache (:class:`EncoderCache`) sits beside it: vision-encoder outputs kept by
the image's content key, so a repeated image is not encoded again, sized in vision tokens (one
embedding per token, as vLLM's EncoderCacheManager counts them) and evicted least recently used
first.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from pytest_llmperf.errors import InputError

if TYPE_CHECKING:
    from collections.abc import Sequence


def block_hashes(token_ids: Sequence[int], block_size: int, salt: int = 0) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids`` (a trailing partial block is not hashed).

    ``salt`` starts the chain: vLLM puts a request's LoRA adapter into its block hashes, so equal
    prompts under different adapters (or the base model) share no cached block."""
    out: list[int] = []
    prev = salt
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

    def reset_prefix_cache(self) -> int:
        """Forget every cached block no running sequence holds (vLLM's ``/reset_prefix_cache``,
        which the client calls before each trial so no trial starts warm from the one before);
        returns how many were dropped. Blocks in use stay: their sequences still need them."""
        dropped = len(self._evictable)
        for h in self._evictable:
            del self._refcount[h]
        self._evictable.clear()
        return dropped

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


class EncoderCache:
    """Encoder outputs by image key, within ``capacity_tokens`` vision tokens; LRU eviction.

    vLLM V1 keeps an image's encoder output after its request ends and reuses it for any request
    with the same multimodal hash until the space is needed. Entries still waiting to be read by
    a running prefill are not protected here (vLLM's are); with the default size (at least one
    step's token budget) that only matters for steps that encode more than the cache holds.
    """

    __slots__ = ("capacity_tokens", "used_tokens", "_entries")

    def __init__(self, capacity_tokens: int) -> None:
        if capacity_tokens < 0:
            raise InputError(f"capacity_tokens must not be negative, got {capacity_tokens}")
        self.capacity_tokens = capacity_tokens
        self.used_tokens = 0
        self._entries: OrderedDict[int, int] = OrderedDict()  # key -> tokens, oldest first

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def lookup(self, key: int) -> bool:
        """True (and the entry becomes the most recently used) when ``key`` is cached."""
        entries = self._entries
        if key in entries:
            entries.move_to_end(key)
            return True
        return False

    def insert(self, key: int, num_tokens: int) -> None:
        """Keep an encoder output, evicting the least recently used ones to make room."""
        if num_tokens > self.capacity_tokens or key in self._entries:
            return
        entries = self._entries
        while self.used_tokens + num_tokens > self.capacity_tokens:
            _, tokens = entries.popitem(last=False)
            self.used_tokens -= tokens
        entries[key] = num_tokens
        self.used_tokens += num_tokens
