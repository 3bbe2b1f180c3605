"""LongSpec drafting (method `longspec`): the draft layer of longspec_model.py over a ring buffer of
its own keys and values (the last `window` positions, fixed size) and the target's last-layer KV.

The target returns its last-layer keys and values for every position it kept
(`SeqSpec.features = "last_kv"`, rows [2 * kv_heads * head_dim], 4 bytes a float over the wire);
the drafter keeps them in a `TargetKVMirror` per sequence: the same bytes as one target layer's
cache. Its own per-sequence state, the ring, is constant in the context length.

Calibration each round: the self-attention keys and values of the newly committed tokens depend on
their tokens and positions only (the self-attention reads the embedding), so they go straight into
the ring; the pending token's row proposes the first draft token. Draft rows (a chain, or a tree's
nodes at position = pending + depth) are scratch: they attend the ring and their ancestors, and the
target KV at positions before their own (lag >= 1, as in training). Verification is unchanged, so
outputs stay exactly the target's whatever the draft proposes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specray.kernels.attention import ancestor_matrix
from specray.kernels.drafters.base import DraftRequest
from specray.kernels.drafters.longspec_model import LongSpecLayer, attend
from specray.kernels.drafters.tree_draft import TreeDraftModelDrafter
from specray.kernels.drafters.tree_shapes import TreeSpec
from specray.kernels.drafters.vocab_trim import TrimmedVocab, draw_head_rows
from specray.kernels.proposal import Proposal

class TargetKVMirror:
    """The target's last-layer keys and values of one sequence, appended as the target keeps them.
    Row 0 is the cross-attention's zero sink, so a draft step attends the mirror in place (no copy)."""

    def __init__(self, num_kv_heads: int, head_dim: int, device="cpu"):
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        self.kv = torch.zeros(1, 2, num_kv_heads, head_dim, device=device)  # [1 + capacity, 2, K, D]: sink, then positions
        self.length = 0

    @property
    def row_width(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim

    def append(self, rows: torch.Tensor) -> None:
        """rows [r, 2 * K * D]: keys (K heads), then values, for the next r positions."""
        if rows.dim() != 2 or rows.shape[1] != self.row_width:
            raise ValueError(f"a LongSpec draft reads target KV rows of width {self.row_width} (2 x kv_heads x "
                             f"head_dim of the target it was trained for), got {tuple(rows.shape)}")
        need = 1 + self.length + rows.shape[0]
        if need > self.kv.shape[0]:  # amortised doubling: appends stay linear overall
            grown = self.kv.new_zeros(max(need, 2 * self.kv.shape[0], 64), *self.kv.shape[1:])
            grown[:1 + self.length] = self.kv[:1 + self.length]
            self.kv = grown
        self.kv[1 + self.length:need] = rows.view(-1, 2, self.num_kv_heads, self.head_dim).to(self.kv)
        self.length += rows.shape[0]

    def keys_values(self) -> tuple[torch.Tensor, torch.Tensor]:
        """-> k, v [1, 1 + length, K, D] views: the sink, then every kept position."""
        kv = self.kv[:1 + self.length].unsqueeze(0)
        return kv[:, :, 0], kv[:, :, 1]

    def nbytes(self) -> int:
        return self.length * self.row_width * self.kv.element_size()


@dataclass
class _Ring:
    """The self-attention keys and values of a sequence's last `window` committed positions:
    position p lives in slot p % window."""

    kv: torch.Tensor  # [window, 2, K, D]
    positions: torch.Tensor  # [window] int64, -1 where empty
    fed: int = 0  # committed positions written so far

    def __post_init__(self) -> None:
        assert self.kv.shape[0] == self.positions.shape[0] and self.fed >= 0

    def write(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """positions [n] (ascending, the last n fed); k, v [n, K, D]."""
        slots = positions % self.kv.shape[0]
        self.kv[slots] = torch.stack([k, v], 1)
        self.positions[slots] = positions

    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size() + self.positions.numel() * 8


@dataclass
class _State:
    ring: _Ring
    mirror: TargetKVMirror
    root_q: torch.Tensor | None = None  # [1, H, D] the pending token's query, from this round's calibration


class LongSpecDrafter:
    name = "longspec"

    def __init__(self, layer: LongSpecLayer, embed: torch.Tensor, head: torch.Tensor,
                 vocab_trim_ids: torch.Tensor | None = None):
        self.layer, self.config = layer, layer.config
        self.embed = embed  # [vocab_size, hidden] the target's, frozen
        self.vocab = None if vocab_trim_ids is None else TrimmedVocab(vocab_trim_ids.to(head.device),
                                                                      self.config.vocab_size)
        self.head = head if self.vocab is None else head[self.vocab.token_ids].contiguous()  # [vocab or k, hidden]
        self.states: dict[object, _State] = {}

    # -- state -----------------------------------------------------------------------------------
    def _state(self, seq_id: object) -> _State:
        state = self.states.get(seq_id)
        if state is None:
            c, w = self.config, self.layer.window
            dev = self.embed.device
            ring = _Ring(torch.zeros(w, 2, c.num_kv_heads, c.head_dim, device=dev),
                         torch.full((w,), -1, dtype=torch.long, device=dev))
            state = self.states[seq_id] = _State(ring, TargetKVMirror(c.num_kv_heads, c.head_dim, dev))
        return state

    def draft_memory_bytes(self, seq_id: object) -> int:
        """The draft's own state for a sequence (the ring): constant in its length."""
        return self.states[seq_id].ring.nbytes()

    def mirror_bytes(self, seq_id: object) -> int:
        """The target-KV mirror's bytes for a sequence (one target layer's KV)."""
        return self.states[seq_id].mirror.nbytes()

    @torch.inference_mode()
    def defer(self, requests: list[DraftRequest]) -> None:
        """Keep the target KV these requests carry (another drafter proposed for them this round)."""
        for r in requests:
            if r.features is not None:
                self._state(r.seq_id).mirror.append(r.features)

    def release(self, seq_id: object) -> None:
        self.states.pop(seq_id, None)

    # -- rows ------------------------------------------------------------------------------------
    def _emb(self, tokens: list[int]) -> torch.Tensor:
        return self.embed[torch.tensor(tokens, dtype=torch.long, device=self.embed.device)].unsqueeze(0)  # [1, n, hidden]

    def _calibrate(self, r: DraftRequest) -> _State:
        """Take the target KV and write the new committed tokens' self keys and values into the ring."""
        state = self._state(r.seq_id)
        if r.features is not None:
            state.mirror.append(r.features)
        length = len(r.token_ids)
        if state.mirror.length > length - 1:
            raise ValueError(f"sequence {r.seq_id!r}: target KV for {state.mirror.length} positions, but only "
                             f"{length - 1} are committed before the pending token")
        start = max(state.ring.fed, length - self.layer.window)
        positions = torch.arange(start, length, device=self.embed.device)  # [n]
        q, k, v = self.layer.self_qkv(self._emb(r.token_ids[start:]), positions.unsqueeze(0))
        state.ring.write(positions, k[0], v[0])
        state.ring.fed = length
        state.root_q = q[:, -1:]  # [1, 1, H, D]
        return state

    def _root_hidden(self, r: DraftRequest, state: _State) -> torch.Tensor:
        """The pending token's row -> hidden [1, hidden]."""
        p = len(r.token_ids) - 1
        ring = state.ring
        visible = ((ring.positions > p - self.layer.window) & (ring.positions >= 0)).view(1, 1, -1)
        out = attend(state.root_q, ring.kv[None, :, 0], ring.kv[None, :, 1], visible, sink=False)
        ck, cv = state.mirror.keys_values()
        pos = torch.tensor([[p]], device=self.embed.device)
        cross = torch.ones(1, 1, ck.shape[1], dtype=torch.bool, device=self.embed.device)  # every kept position < p
        return self.layer.finish(self._emb(r.token_ids[-1:]), out, pos, ck, cv, cross, sink_included=True)[0]

    def _draft_hidden(self, r: DraftRequest, state: _State, tokens: list[int], parents: list[int],
                      rows: list[int]) -> torch.Tensor:
        """Scratch draft tokens after the committed ones (a tree: parents[i] < i, -1 under the pending
        token; position = pending + depth) -> hidden [len(rows), hidden] at `rows`."""
        dev, w = self.embed.device, self.layer.window
        anc = ancestor_matrix(parents, len(tokens)).to(dev)  # [n, n]
        depth = anc.sum(1)  # [n] 1 for the root's children
        positions = (len(r.token_ids) - 1 + depth).unsqueeze(0)  # [1, n]
        emb = self._emb(tokens)
        q, k, v = self.layer.self_qkv(emb, positions)
        sel = torch.tensor(rows, dtype=torch.long, device=dev)
        p = positions[0, sel]  # [m]
        ring = state.ring
        ring_visible = (ring.positions[None, :] > p[:, None] - w) & (ring.positions[None, :] >= 0)  # [m, window]
        new_visible = anc[sel] & (positions[0][None, :] > p[:, None] - w)  # [m, n]
        keys = torch.cat([ring.kv[None, :, 0], k], 1)  # [1, window + n, K, D]
        values = torch.cat([ring.kv[None, :, 1], v], 1)
        out = attend(q[:, sel], keys, values, torch.cat([ring_visible, new_visible], 1).unsqueeze(0), sink=False)
        ck, cv = state.mirror.keys_values()
        cross = torch.ones(1, len(rows), ck.shape[1], dtype=torch.bool, device=dev)  # every kept position < p
        return self.layer.finish(emb[:, sel], out, p.unsqueeze(0), ck, cv, cross, sink_included=True)[0]

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [rows, hidden] -> [rows, vocab_size], or [rows, k] over a VocabTrim subset's ids."""
        return F.linear(hidden, self.head).float()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [rows, hidden] -> [rows, vocab_size] (off a VocabTrim subset: -inf)."""
        logits = self.head_logits(hidden)
        return logits if self.vocab is None else self.vocab.expand(logits)

    # -- chains ----------------------------------------------------------------------------------
    def root_logits(self, requests: list[DraftRequest], trimmed: bool = False) -> torch.Tensor:
        """Calibrate every request -> the drafting ones' first-token logits [num drafting, vocab_size]
        (`trimmed`: `head_logits`' rows)."""
        states = [self._calibrate(r) for r in requests]
        rows = [self._root_hidden(r, s) for r, s in zip(requests, states, strict=True) if r.num_draft_tokens > 0]
        if not rows:
            return torch.empty(0, self.head.shape[0] if trimmed else self.config.vocab_size)
        return (self.head_logits if trimmed else self.logits)(torch.cat(rows))

    def _draw(self, requests: list[DraftRequest], active: list[int], logits: torch.Tensor,
              drafts: list[list[int]], probs: list[list[torch.Tensor]]) -> None:
        """`sample_step` on `head_logits`' rows [len(active), vocab_size or k]: over a VocabTrim
        subset `TrimmedVocab.draw`, which takes a greedy step's argmax without expanding the rows."""
        draw_head_rows(self.vocab, requests, active, logits, drafts, probs)

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest]) -> list[Proposal]:
        if not requests:
            return []
        logits = self.root_logits(requests, trimmed=True)  # [num drafting, vocab_size or k]
        drafts: list[list[int]] = [[] for _ in requests]
        probs: list[list[torch.Tensor]] = [[] for _ in requests]
        active = [i for i, r in enumerate(requests) if r.num_draft_tokens > 0]
        while active:
            self._draw(requests, active, logits, drafts, probs)
            active = [i for i in active if len(drafts[i]) < requests[i].num_draft_tokens]
            if not active:
                break
            hidden = [self._draft_hidden(requests[i], self.states[requests[i].seq_id], drafts[i],
                                         list(range(-1, len(drafts[i]) - 1)), [len(drafts[i]) - 1]) for i in active]
            logits = self.head_logits(torch.cat(hidden))
        return [Proposal(d, None if r.sampling.greedy or not p else torch.stack(p))
                for d, p, r in zip(drafts, probs, requests, strict=True)]


class LongSpecTreeDrafter(TreeDraftModelDrafter):
    """Trees (RSD-C, RSD-S, SpecTr, top-k) grown level by level from the LongSpec draft: each level
    runs the tree so far as scratch rows and reads its frontier."""

    name = "longspec"

    def __init__(self, base: LongSpecDrafter, tree: TreeSpec):
        self.base, self.tree = base, tree

    def defer(self, requests: list[DraftRequest]) -> None:
        self.base.defer(requests)

    def _root_logits(self, requests: list[DraftRequest]) -> torch.Tensor:
        return self.base.root_logits(requests)

    def _frontier_logits(self, requests, plans, active) -> dict[int, torch.Tensor]:
        base, out = self.base, {}
        hidden = [base._draft_hidden(requests[i], base.states[requests[i].seq_id], list(plans[i].build.tokens),
                                     list(plans[i].build.parents), list(plans[i].build.frontier)) for i in active]
        logits = base.logits(torch.cat(hidden))
        row0 = 0
        for i, h in zip(active, hidden, strict=True):
            out[i] = logits[row0:row0 + h.shape[0]]
            row0 += h.shape[0]
        return out

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest]) -> list[Proposal]:
        return super().propose(requests)
