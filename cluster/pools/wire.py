"""A compact binary form of the router <-> draft pool messages: draft items (with their
calibration deltas) one way, proposals the other. Every draft transport carries these bytes, so
bytes per round compare like for like.

Proposal distributions travel sparse when that is exact: top-k / top-p drafting leaves most of a
row exactly zero, and a row with at most a third of its entries nonzero costs less as
(index, value) pairs. Values are the drafter's float32s, bit for bit, so verification sees the
same p either way. Trees travel as their kind, parent indices and (i.i.d. sets) chain counts.
"""

from __future__ import annotations

import numpy as np
import torch

from specray.actors.messages import DraftItem, SeqSpec
from specray.kernels.proposal import KINDS, Proposal
from specray.kernels.sampling import SamplingConfig

_DTYPES = {0: np.int32, 1: np.float32, 2: np.int64, 3: np.uint8, 4: np.float64}
_CODES = {np.dtype(v): k for k, v in _DTYPES.items()}
NONE_PROBS, DENSE, SPARSE = 0, 1, 2


def pack_arrays(arrays: list[np.ndarray]) -> bytes:
    """[count][per array: dtype code, length][payloads]: little-endian throughout."""
    head = np.array([len(arrays)] + [x for a in arrays for x in (_CODES[a.dtype], a.size)], dtype=np.int64)
    return head.tobytes() + b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)


def unpack_arrays(buf: bytes) -> list[np.ndarray]:
    count = int(np.frombuffer(buf, np.int64, 1)[0])
    meta = np.frombuffer(buf, np.int64, 2 * count, offset=8).reshape(count, 2)
    offset, out = 8 * (1 + 2 * count), []
    for code, size in meta.tolist():
        dtype = np.dtype(_DTYPES[code])
        out.append(np.frombuffer(buf, dtype, size, offset=offset))
        offset += size * dtype.itemsize
    assert offset == len(buf), "trailing bytes: corrupt message"
    return out


# -- draft items ------------------------------------------------------------------------------
def encode_items(items: list[DraftItem]) -> bytes:
    assert not any("\n" in str(i.seq_id) for i in items), "seq ids are newline-separated"
    ids = "\n".join(str(i.seq_id) for i in items).encode()
    specs = [i.spec for i in items]
    return pack_arrays([
        np.frombuffer(ids, np.uint8),
        np.array([len(i.committed_delta) for i in items], np.int32),
        np.array([t for i in items for t in i.committed_delta], np.int32),
        np.array([i.num_draft_tokens for i in items], np.int32),
        np.array([s is not None for s in specs], np.uint8),
        np.array([s.sampling.temperature if s else 0 for s in specs], np.float64),  # exact: drafts must match
        np.array([s.sampling.top_k if s else 0 for s in specs], np.int32),
        np.array([s.sampling.top_p if s else 1 for s in specs], np.float64),
        np.array([-1 if s is None or s.seed is None else s.seed for s in specs], np.int64),
        np.array([-1 if i.verify_budget is None else i.verify_budget for i in items], np.int32),
        # target features (eagle drafts): rows per item (-1: none), width, then fp32 rows bit for bit
        np.array([-1 if i.features is None else i.features.shape[0] for i in items], np.int32),
        np.array([next((i.features.shape[1] for i in items if i.features is not None), 0)], np.int32),
        _feature_values(items),
    ])


def _feature_values(items: list[DraftItem]) -> np.ndarray:
    rows = [i.features.detach().to("cpu", torch.float32).reshape(-1) for i in items if i.features is not None]
    return torch.cat(rows).numpy() if rows else np.zeros(0, np.float32)


def decode_items(buf: bytes) -> list[DraftItem]:
    (ids, lens, deltas, ks, has_spec, temps, top_ks, top_ps, seeds, budgets, feature_rows, width,
     values) = unpack_arrays(buf)
    offsets = np.concatenate([[0], np.cumsum(np.maximum(feature_rows, 0))]) * int(width[0])
    names = bytes(ids).decode().split("\n") if len(lens) else []
    starts = np.concatenate([[0], np.cumsum(lens)])
    items = []
    for i, name in enumerate(names):
        spec = None
        if has_spec[i]:
            sampling = SamplingConfig(float(temps[i]), int(top_ks[i]), float(top_ps[i]))
            spec = SeqSpec(sampling, None if seeds[i] < 0 else int(seeds[i]))
        budget = None if budgets[i] < 0 else int(budgets[i])
        features = (None if feature_rows[i] < 0 else
                    torch.from_numpy(values[offsets[i]:offsets[i + 1]].copy()).view(int(feature_rows[i]), -1))
        items.append(DraftItem(name, deltas[starts[i]:starts[i + 1]].tolist(), int(ks[i]), spec, budget,
                               features))
    return items


# -- proposals --------------------------------------------------------------------------------
def encode_proposals(proposals: list[Proposal]) -> bytes:
    kinds, dense, nnz, indices, values = [], [], [], [], []
    vocab = 0
    for p in proposals:
        if p.draft_probs is None or p.num_draft_tokens == 0:
            kinds.append(NONE_PROBS)
            continue
        probs = p.draft_probs.detach().to("cpu", torch.float32)  # [k, vocab_size]
        vocab = probs.shape[1]
        mask = probs != 0
        if int(mask.sum()) * 3 <= probs.numel():
            kinds.append(SPARSE)
            nnz.append(mask.sum(1).numpy().astype(np.int32))
            rows, cols = mask.nonzero(as_tuple=True)
            indices.append(cols.numpy().astype(np.int32))
            values.append(probs[rows, cols].numpy())
        else:
            kinds.append(DENSE)
            dense.append(probs.numpy().ravel())
    cat = lambda parts, dt: np.concatenate(parts).astype(dt) if parts else np.zeros(0, dt)  # noqa: E731
    return pack_arrays([
        np.array([vocab], np.int32), np.array(kinds, np.uint8),
        np.array([p.num_draft_tokens for p in proposals], np.int32),
        np.array([t for p in proposals for t in p.draft_token_ids], np.int32),
        cat(dense, np.float32), cat(nnz, np.int32), cat(indices, np.int32), cat(values, np.float32),
        # trees: the proposal kind, parents of tree proposals, counts of iid proposals (in order)
        np.array([KINDS.index(p.kind) for p in proposals], np.uint8),
        np.array([x for p in proposals if p.is_tree for x in p.tree_parents()], np.int32),
        np.array([x for p in proposals if p.counts is not None for x in p.counts], np.int32),
    ])


def decode_proposals(buf: bytes) -> list[Proposal]:
    vocab, kinds, ks, tokens, dense, nnz, indices, values, tree_kinds, parents, counts = unpack_arrays(buf)
    vocab = int(vocab[0])
    out, t0, d0, r0, e0, a0, c0 = [], 0, 0, 0, 0, 0, 0
    for kind, k, tree_kind in zip(kinds.tolist(), ks.tolist(), tree_kinds.tolist(), strict=True):
        proposal_kind = KINDS[tree_kind]
        tree_parents = tree_counts = None
        if proposal_kind != "chain":
            tree_parents, a0 = parents[a0:a0 + k].tolist(), a0 + k
        if proposal_kind == "iid":
            tree_counts, c0 = counts[c0:c0 + k].tolist(), c0 + k
        draft = tokens[t0:t0 + k].tolist()
        t0 += k
        probs = None
        if kind == DENSE:
            probs = torch.from_numpy(dense[d0:d0 + k * vocab].copy()).view(k, vocab)
            d0 += k * vocab
        elif kind == SPARSE:
            row_nnz = nnz[r0:r0 + k]
            n = int(row_nnz.sum())
            rows = torch.from_numpy(np.repeat(np.arange(k), row_nnz))
            probs = torch.zeros(k, vocab)
            probs[rows, torch.from_numpy(indices[e0:e0 + n].astype(np.int64))] = torch.from_numpy(values[e0:e0 + n].copy())
            r0, e0 = r0 + k, e0 + n
        out.append(Proposal(draft, probs, tree_parents, proposal_kind, tree_counts))
    assert a0 == len(parents) and c0 == len(counts), "trailing tree entries: corrupt message"
    return out


def encode_release(seq_ids: list) -> bytes:
    return pack_arrays([np.frombuffer("\n".join(map(str, seq_ids)).encode(), np.uint8)])


def decode_release(buf: bytes) -> list[str]:
    (ids,) = unpack_arrays(buf)
    return bytes(ids).decode().split("\n") if len(ids) else []
