"""Paged KV cache: fixed-size blocks, a block table per sequence, a pool of blocks.

Rolling back rejected chain tokens is a length update (`set_cached`), never a copy. A verified
tree's accepted path is scattered over scratch slots; `compact` moves it into place. With
`prefix_caching`, full blocks of committed tokens are shared between sequences whose prefixes
agree (kernels/prefix_cache.py): `match_prefix` takes them, `register_blocks` offers them. Beside
the KV, a slot may hold its token's target features (the final hidden state an eagle draft reads),
so a sequence whose draft reads them can take a block too: `write_features`, `read_features`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specray.kernels.config import ModelConfig
from specray.kernels.ints import ceil_div
from specray.kernels.prefix_cache import ROOT, BlockPool, OutOfBlocksError, block_digest, salted_root

__all__ = ["BlockTable", "OutOfBlocksError", "PagedKVCache"]


@dataclass
class BlockTable:
    """The blocks one sequence owns and how many of its tokens hold valid KV."""

    blocks: list[int] = field(default_factory=list)
    num_cached: int = 0  # tokens whose KV is valid, a prefix of the sequence
    digests: list[bytes] = field(default_factory=list)  # prefix caching: the chain digest of each first full block
    root: bytes = ROOT  # the chain's start: salted_root(the sequence's cache salt)

    def __post_init__(self) -> None:
        assert self.num_cached >= 0


class PagedKVCache:
    """KV storage for all layers: kv [num_layers, 2 * num_kv_heads, num_slots, head_dim], keys in
    the first num_kv_heads rows, values in the rest, so one gather per layer fetches both in the
    [heads, keys, head_dim] layout attention consumes.

    A slot is one token position; block b owns slots [b * block_size, (b + 1) * block_size).
    """

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int = 16,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 prefix_caching: bool = False):
        assert num_blocks >= 1 and block_size >= 1
        shape = (config.num_layers, 2 * config.num_kv_heads, num_blocks * block_size, config.head_dim)
        self.kv = torch.zeros(shape, dtype=dtype, device=device)
        self.num_kv_heads = config.num_kv_heads
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.pool = BlockPool(num_blocks, caching=prefix_caching)
        self.tables: dict[object, BlockTable] = {}
        # seq -> (its blocks' slots, how many of its first blocks have consecutive ids): `_block_view`
        self._block_slots: dict[object, tuple[torch.Tensor, int]] = {}
        self.features: torch.Tensor | None = None  # [num_slots, width] once written (prefix caching only)
        self.featured: set[int] = set()  # blocks whose every slot holds its token's features

    # -- allocation -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks a sequence can still get (cached ones nobody uses included)."""
        return self.pool.num_available

    @property
    def prefix_caching(self) -> bool:
        return self.pool.caching

    def blocks_needed(self, seq_id: object, num_tokens: int) -> int:
        """Extra blocks `seq_id` needs so that its first `num_tokens` slots exist."""
        have = len(self.tables[seq_id].blocks) if seq_id in self.tables else 0
        return max(0, ceil_div(num_tokens, self.block_size) - have)

    def reserve(self, seq_id: object, num_tokens: int) -> None:
        """Make sure slots for tokens [0, num_tokens) exist for `seq_id`."""
        table = self.tables.setdefault(seq_id, BlockTable())
        taken = self.pool.take(self.blocks_needed(seq_id, num_tokens))
        self.featured.difference_update(taken)  # an evicted block's features are another prefix's
        table.blocks.extend(taken)

    def free(self, seq_id: object) -> None:
        table = self.tables.pop(seq_id, None)
        self._block_slots.pop(seq_id, None)
        if table is not None:
            for block, digest in zip(table.blocks, table.digests):  # private copies stay cached (BlockPool.register)
                self.pool.register(block, digest)
            self.pool.give_back(table.blocks)

    def release_unused(self, seq_id: object) -> int:
        """Give the blocks past the sequence's cached tokens back to the pool (a verified tree's
        rejected branches): -> how many. Its next round reserves what it needs again."""
        table = self.tables[seq_id]
        keep = ceil_div(table.num_cached, self.block_size)
        extra = table.blocks[keep:]
        if extra:
            del table.blocks[keep:]
            self.pool.give_back(extra)
            self._block_slots.pop(seq_id, None)  # a later block may get another id at the same index
        return len(extra)

    # -- prefix caching -----------------------------------------------------------------------
    def salt(self, seq_id: object, salt: str | None) -> None:
        """A new sequence's cache salt: its blocks are taken from and offered to its salt's alone."""
        table = self.tables.setdefault(seq_id, BlockTable())
        assert not table.digests, "a sequence is salted before its first block is matched or offered"
        table.root = salted_root(salt)

    def match_prefix(self, seq_id: object, token_ids: list[int], limit: int, with_features: bool = False) -> int:
        """Take the registered blocks that hold `token_ids`' next full blocks, up to position `limit`,
        for a sequence whose every cached block so far was taken so: -> tokens now cached this way.
        `with_features`: only blocks that hold their tokens' features too."""
        table = self.tables.setdefault(seq_id, BlockTable())
        bs, have = self.block_size, len(table.digests)
        if not self.prefix_caching or len(table.blocks) != have or table.num_cached != have * bs:
            return 0
        parent, end = table.digests[-1] if table.digests else table.root, min(limit, len(token_ids))
        self.pool.stats.queried_tokens += max(0, end - have * bs)
        for i in range(have, end // bs):
            digest = block_digest(parent, token_ids[i * bs:(i + 1) * bs])
            if with_features and self.pool.by_digest.get(digest) not in self.featured:
                break
            block = self.pool.lookup(digest)
            if block is None:
                break
            table.blocks.append(block)
            table.digests.append(digest)
            parent = digest
        table.num_cached = len(table.blocks) * bs
        self.pool.stats.hit_tokens += table.num_cached - have * bs
        return table.num_cached - have * bs

    def restore(self, seq_id: object, num_blocks: int, num_digests: int, num_cached: int) -> None:
        """Undo a failed step: the sequence's blocks past its first `num_blocks` go back (taken from
        the prefix cache or reserved for the step: none holds a committed token of its own), and its
        digests and cached length are what they were."""
        table = self.tables.get(seq_id)
        if table is None:
            return
        self.pool.give_back(table.blocks[num_blocks:])
        del table.blocks[num_blocks:], table.digests[num_digests:]
        table.num_cached = num_cached
        self._block_slots.pop(seq_id, None)

    def register_blocks(self, seq_id: object, token_ids: list[int], with_features: bool = False) -> None:
        """Offer the sequence's full blocks of committed tokens (`token_ids`: at least its cached
        ones, in order) to later sequences; `with_features`: every cached token's features are
        written (`write_features`), so these blocks serve sequences that read them too."""
        table = self.tables.get(seq_id)
        if not self.prefix_caching or table is None:
            return
        bs = self.block_size
        for i in range(len(table.digests), table.num_cached // bs):
            parent = table.digests[-1] if table.digests else table.root
            table.digests.append(block_digest(parent, token_ids[i * bs:(i + 1) * bs]))
            self.pool.register(table.blocks[i], table.digests[-1])
            if with_features:
                self.featured.add(table.blocks[i])

    def write_features(self, seq_id: object, start: int, rows: torch.Tensor) -> None:
        """rows [n, width]: the features of the sequence's tokens start .. start + n - 1, kept in their
        slots (exactly: a later sequence reads them in place of computing them)."""
        if self.features is None:  # one kind a cache: its target's final hidden states
            self.features = torch.zeros(self.num_blocks * self.block_size, *rows.shape[1:], dtype=rows.dtype,
                                        device=self.kv.device)
        assert self.features.shape[1:] == rows.shape[1:] and self.features.dtype == rows.dtype, \
            f"features {tuple(rows.shape[1:])} {rows.dtype} beside {tuple(self.features.shape[1:])} {self.features.dtype}"
        self.features[self.slots(seq_id, start, start + rows.shape[0])] = rows.to(self.features.device)

    def read_features(self, seq_id: object, start: int, end: int) -> torch.Tensor:
        """[end - start, width] the features kept for the sequence's tokens start .. end - 1."""
        assert self.features is not None, "no features were written"
        return self.features[self.slots(seq_id, start, end)]

    # -- lengths ----------------------------------------------------------------------------
    def num_cached(self, seq_id: object) -> int:
        table = self.tables.get(seq_id)
        return 0 if table is None else table.num_cached

    def set_cached(self, seq_id: object, num_cached: int) -> None:
        """Declare the first `num_cached` tokens valid (grow after a write, shrink to roll back)."""
        table = self.tables[seq_id]
        assert 0 <= num_cached <= len(table.blocks) * self.block_size
        table.num_cached = num_cached

    def slots(self, seq_id: object, start: int, end: int) -> torch.Tensor:
        """[end - start] slot indices of the sequence's token positions start..end-1 (a read-only view).

        Every step asks for a sequence's whole history; blocks get appended, or released from the end
        (which drops this copy), so the slots of its blocks are kept per sequence and rebuilt only
        when its blocks change."""
        assert 0 <= start <= end <= len(self.tables[seq_id].blocks) * self.block_size
        return self._block_view(seq_id)[0][start:end]

    def slot_run(self, seq_id: object, end: int) -> tuple[int, int] | None:
        """(first slot, first slot + end) where the slots of positions 0..end-1 are one ascending run
        (its first blocks have consecutive ids), else None."""
        blocks = self.tables[seq_id].blocks
        assert 0 < end <= len(blocks) * self.block_size
        if ceil_div(end, self.block_size) > self._block_view(seq_id)[1]:
            return None
        first = blocks[0] * self.block_size
        return first, first + end

    def _block_view(self, seq_id: object) -> tuple[torch.Tensor, int]:
        """The sequence's blocks' slots [num_blocks * block_size] and how many of its first blocks have
        consecutive ids, kept until its blocks change."""
        blocks = self.tables[seq_id].blocks
        view = self._block_slots.get(seq_id)
        if view is None or view[0].shape[0] != len(blocks) * self.block_size:
            first = torch.tensor(blocks, dtype=torch.long).unsqueeze(1) * self.block_size  # [num_blocks, 1]
            run = 1
            while run < len(blocks) and blocks[run] == blocks[0] + run:
                run += 1
            view = self._block_slots[seq_id] = ((first + torch.arange(self.block_size)).flatten(), run)
        return view

    def compact(self, seq_id: object, start: int, positions: list[int]) -> None:
        """Move the KV at token `positions` (ascending, each >= its destination) to positions
        start, start + 1, ...: the accepted path of a verified tree, written in tree order."""
        assert all(p >= start + j for j, p in enumerate(positions))
        assert all(a < b for a, b in zip(positions, positions[1:]))
        moved = [(start + j, p) for j, p in enumerate(positions) if p != start + j]
        if not moved:
            return
        dst = self.slots(seq_id, 0, start + len(positions))[[d for d, _ in moved]]
        src = self.slots(seq_id, 0, max(positions) + 1)[[s for _, s in moved]]
        self.kv[:, :, dst] = self.kv[:, :, src]  # the right side is gathered first: overlaps are safe
