"""Automatic prefix caching: a paged cache's blocks, shared between sequences whose tokens agree.

A block is registered under a digest of its tokens and every token before it (a chain of
BLAKE2b digests, block after block, so a digest names the whole prefix: two prefixes that differ
anywhere never share one), from a root that a request's cache salt changes. A new sequence whose
first blocks' digests are registered takes those blocks instead of computing their KV again. Only
full blocks of committed tokens are registered, and a sequence never writes below its committed
length, so a shared block is never written.

Lossless because a target's steps are row-invariant (kernels/invariant.py): a token's KV depends on
the tokens before it alone, never on how the steps that computed it were cut, so a shared block
holds the bits the sequence would have computed itself.

Freed registered blocks stay in the cache, least recently freed first out, until a new block is
needed and the free list is empty (vLLM's automatic prefix caching, SGLang's radix cache).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

ROOT = b"specray-prefix-root"  # the digest before a sequence's first block


def salted_root(salt: str | None) -> bytes:
    """The digest before the first block of a sequence with this cache salt (vLLM's `cache_salt`):
    prefixes of different salts never share a block, so one tenant cannot time another's prompts."""
    if salt is None:
        return ROOT
    return hashlib.blake2b(ROOT + b"/salt/" + salt.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def block_digest(parent: bytes, token_ids: list[int]) -> bytes:
    """The digest of a block holding `token_ids`, after the prefix whose digest is `parent`."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(b"".join(t.to_bytes(4, "little", signed=True) for t in token_ids))
    return h.digest()


class OutOfBlocksError(RuntimeError):
    """The cache has no free block left; the scheduler should preempt or wait."""


@dataclass
class PrefixStats:
    """Prompt tokens looked up and found, over the cache's life (the served metrics read them)."""

    queried_tokens: int = 0
    hit_tokens: int = 0

    def __post_init__(self) -> None:
        assert 0 <= self.hit_tokens <= self.queried_tokens


@dataclass
class BlockPool:
    """Block ids, each free, owned (by one or more sequences: its reference count) or cached
    (registered, owned by none, evictable). `caching` off: no block is ever registered, and the
    pool is a plain free list."""

    num_blocks: int
    caching: bool = False
    # pop() hands out low ids first
    free: list[int] = field(default_factory=list)
    refs: list[int] = field(default_factory=list)
    by_digest: dict[bytes, int] = field(default_factory=dict)
    digest_of: dict[int, bytes] = field(default_factory=dict)
    evictable: OrderedDict = field(default_factory=OrderedDict)  # block -> None, least recently freed first
    stats: PrefixStats = field(default_factory=PrefixStats)

    def __post_init__(self) -> None:
        assert self.num_blocks >= 1
        self.free = list(range(self.num_blocks - 1, -1, -1))
        self.refs = [0] * self.num_blocks

    @property
    def num_available(self) -> int:
        """Blocks a sequence can get: free ones and cached ones nobody owns."""
        return len(self.free) + len(self.evictable)

    def take(self, count: int) -> list[int]:
        """`count` blocks for one sequence: free ones first, then the least recently freed cached."""
        if count > self.num_available:
            raise OutOfBlocksError(f"need {count} blocks, {self.num_available} free")
        taken = []
        for _ in range(count):
            if self.free:
                block = self.free.pop()
            else:
                block, _ = self.evictable.popitem(last=False)
                self._unregister(block)
            self.refs[block] = 1
            taken.append(block)
        return taken

    def give_back(self, blocks: list[int]) -> None:
        """A sequence drops `blocks` (the last one first out of the cache: a prefix's tail is the
        least likely to be shared)."""
        for block in reversed(blocks):
            assert self.refs[block] > 0, f"block {block} is not owned"
            self.refs[block] -= 1
            if self.refs[block] == 0:
                if block in self.digest_of:
                    self.evictable[block] = None
                else:
                    self.free.append(block)

    def lookup(self, digest: bytes) -> int | None:
        """The registered block with this digest, now owned once more; None if there is none."""
        block = self.by_digest.get(digest)
        if block is not None:
            self.evictable.pop(block, None)
            self.refs[block] += 1
        return block

    def register(self, block: int, digest: bytes) -> None:
        """`block` now holds the prefix named `digest` (a full block of committed tokens). A digest
        registered already keeps its block while a sequence uses it (this one stays private); an
        unused one is replaced by this copy, which its sequence keeps from eviction, and freed."""
        if not self.caching or block in self.digest_of:
            return
        old = self.by_digest.get(digest)
        if old is not None:
            if self.refs[old] > 0:
                return
            del self.evictable[old]
            self._unregister(old)
            self.free.append(old)
        self.by_digest[digest] = block
        self.digest_of[block] = digest

    def _unregister(self, block: int) -> None:
        digest = self.digest_of.pop(block)
        if self.by_digest.get(digest) == block:
            del self.by_digest[digest]
