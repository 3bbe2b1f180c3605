"""Ragged, unpadded step inputs (EMS-SD): flat tokens plus per-sequence offsets."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specray.kernels.kv_cache import PagedKVCache


@dataclass
class SeqChunk:
    """New tokens one sequence brings to a step."""

    seq_id: object
    token_ids: list[int]
    context_len: int  # tokens already in the KV cache before this step
    parents: list[int] | None = None  # local parent index per token (-1: root); None = chain
    num_logits: int = 1  # logits wanted for the last `num_logits` tokens (all of them for a tree)
    num_pad: int = 0  # padded baseline only: dummy tokens after the real ones (no logits, KV discarded)
    key_pad: int = 0  # padded baseline only: masked dummy keys after the real ones

    def __post_init__(self) -> None:
        assert len(self.token_ids) >= 1, "a sequence brings at least one token to a step"
        assert self.num_pad >= 0 and self.key_pad >= 0
        assert self.parents is None or self.num_pad == 0, "only chains are padded"
        assert self.context_len >= 0 and 0 <= self.num_logits <= len(self.token_ids)
        if self.parents is not None:
            assert len(self.parents) == len(self.token_ids)
            assert all(-1 <= p < i for i, p in enumerate(self.parents)), "parents precede children"

    def depths(self) -> list[int]:
        if self.parents is None:
            return list(range(len(self.token_ids)))
        depths: list[int] = []
        for p in self.parents:
            depths.append(0 if p < 0 else depths[p] + 1)
        return depths


@dataclass
class RaggedBatch:
    """One forward step over several sequences, never padded."""

    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens] RoPE positions: context_len + depth
    cu_seqlens: list[int]  # [batch + 1] offsets of each sequence's new tokens
    context_lens: list[int]  # [batch]
    parents: list[list[int] | None]  # [batch] per-sequence tree parents (None = chain)
    slot_mapping: torch.Tensor  # [num_tokens] cache slot that receives each new token's KV
    key_slots: torch.Tensor  # [num_keys] slots of every key, context then new tokens, seq after seq
    cu_keylens: list[int]  # [batch + 1]
    logits_indices: torch.Tensor  # [num_logits] rows of num_tokens whose logits are returned
    cu_logits: list[int]  # [batch + 1]
    key_range: tuple[int, int] | None = None  # set when key_slots is one ascending run: slice, don't gather
    key_pads: list[int] | None = None  # [batch] masked dummy keys closing each sequence's keys (padded baseline)

    def __post_init__(self) -> None:
        assert len(self.cu_seqlens) == len(self.context_lens) + 1 == len(self.cu_keylens)
        assert self.input_ids.shape == self.positions.shape == self.slot_mapping.shape
        assert self.cu_seqlens[-1] == self.input_ids.shape[0]
        assert self.cu_keylens[-1] == self.key_slots.shape[0]

    @property
    def batch_size(self) -> int:
        return len(self.context_lens)

    @property
    def num_tokens(self) -> int:
        return self.cu_seqlens[-1]

    def is_single_chain(self) -> bool:
        return self.batch_size == 1 and self.parents[0] is None

    @classmethod
    def build(cls, chunks: list[SeqChunk], cache: PagedKVCache, device="cpu") -> "RaggedBatch":
        """Reserve cache slots for the chunks' new tokens and lay out the flat step inputs (a decode
        step builds one every token: its tensors come from one list and one slot view each)."""
        ids, pos, slots, keys, logit_rows, runs = [], [], [], [], [], []
        cu_seq, cu_key, cu_log = [0], [0], [0]
        for chunk in chunks:
            real, ctx = len(chunk.token_ids), chunk.context_len
            n = real + chunk.num_pad
            assert cache.num_cached(chunk.seq_id) == ctx, "context_len must equal the cached length"
            cache.reserve(chunk.seq_id, ctx + n)
            ids.extend(chunk.token_ids + [0] * chunk.num_pad)
            pos.extend(ctx + d for d in chunk.depths() + list(range(real, n)))
            seq_slots = cache.slots(chunk.seq_id, 0, ctx + n)
            slots.append(seq_slots[ctx:])
            keys.append(torch.cat([seq_slots, seq_slots[:1].repeat(chunk.key_pad)]) if chunk.key_pad else seq_slots)
            runs.append(None if chunk.key_pad else cache.slot_run(chunk.seq_id, ctx + n))
            logit_rows.extend(range(cu_seq[-1] + real - chunk.num_logits, cu_seq[-1] + real))
            cu_seq.append(cu_seq[-1] + n)
            cu_key.append(cu_key[-1] + ctx + n + chunk.key_pad)
            cu_log.append(cu_log[-1] + chunk.num_logits)
        ints = torch.tensor(ids + pos + logit_rows, dtype=torch.long, device=device)
        input_ids, positions, logits_indices = ints.split([len(ids), len(pos), len(logit_rows)])
        joined = lambda parts: parts[0] if len(parts) == 1 else torch.cat(parts)  # noqa: E731
        return cls(
            input_ids=input_ids, positions=positions, cu_seqlens=cu_seq,
            context_lens=[c.context_len for c in chunks], parents=[c.parents for c in chunks],
            slot_mapping=joined(slots).to(device), key_slots=joined(keys).to(device),
            cu_keylens=cu_key, logits_indices=logits_indices, cu_logits=cu_log, key_range=one_run(runs),
            key_pads=[c.key_pad for c in chunks] if any(c.key_pad for c in chunks) else None,
        )


def one_run(runs: list[tuple[int, int] | None]) -> tuple[int, int] | None:
    """The sequences' key slots as one ascending run [first, end), where each is a run and each
    starts where the one before it ends; else None."""
    if any(r is None for r in runs) or any(b[0] != a[1] for a, b in zip(runs, runs[1:])):
        return None
    return runs[0][0], runs[-1][1]


def pad_uniform(chunks: list[SeqChunk]) -> list[SeqChunk]:
    """The padded baseline (EMS-SD's "vanilla"): every sequence brings as many tokens as the
    longest and attends over as many keys as the longest context, the excess masked out."""
    max_new = max(len(c.token_ids) for c in chunks)
    max_ctx = max(c.context_len for c in chunks)
    return [SeqChunk(c.seq_id, c.token_ids, c.context_len, c.parents, c.num_logits,
                     num_pad=max_new - len(c.token_ids), key_pad=max_ctx - c.context_len) for c in chunks]
