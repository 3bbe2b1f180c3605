"""The LongSpec drafter: its ring-buffer rows equal the dense reference (the training forward) at
each draft depth's lag, its own memory stays constant as the context grows, and the target returns
exactly its last layer's KV for the positions it kept."""

import pytest
import torch

from specray.actors.messages import SeqSpec, TargetItem
from specray.actors.target_worker import TargetWorker
from specray.kernels.drafters.base import DraftRequest
from specray.kernels.drafters.longspec import LongSpecDrafter, TargetKVMirror
from specray.kernels.drafters.longspec_folder import load_longspec
from specray.kernels.loader import load_model, resolve
from specray.kernels.proposal import Proposal
from specray.kernels.sampling import SamplingConfig


GREEDY = SamplingConfig(0.0)


def target_kv(target_folder, tokens):
    """The target's last-layer KV rows [len(tokens), 2 * K * D] (prefill through the target worker)."""
    worker = TargetWorker(load_model(resolve(str(target_folder))), num_blocks=64)
    (res,) = worker.step([TargetItem("s", tokens, Proposal([]), SeqSpec(GREEDY, features="last_kv"))])
    return res.features


def test_the_target_returns_its_last_layer_kv(tiny_target):
    worker = TargetWorker(load_model(resolve(str(tiny_target))), num_blocks=64)
    tokens = list(range(3, 20))
    (res,) = worker.step([TargetItem("s", tokens, Proposal([]), SeqSpec(GREEDY, features="last_kv"))])
    slots = worker.cache.slots("s", 0, len(tokens))
    want = worker.cache.kv[-1][:, slots].transpose(0, 1).reshape(len(tokens), -1)
    assert torch.equal(res.features, want)
    (nxt,) = worker.step([TargetItem("s", [res.emitted_token_ids[-1]], Proposal([5, 6]))])  # a chain round
    assert nxt.features.shape == (1 + nxt.num_accepted, want.shape[1])


def dense_rows(layer, embed, head, tokens, target_rows, lag):
    """The reference over the whole sequence at one lag -> logits [len(tokens), vocab]."""
    c = layer.config
    kv = torch.zeros(len(tokens), 2, c.num_kv_heads, c.head_dim)
    kv[:target_rows.shape[0]] = target_rows.view(-1, 2, c.num_kv_heads, c.head_dim)
    emb = embed[torch.tensor(tokens)].unsqueeze(0)
    hidden = layer.dense_forward(emb, torch.arange(len(tokens)).unsqueeze(0), kv[None, :, 0], kv[None, :, 1], lag)
    return hidden[0] @ head.T


@pytest.mark.parametrize("prompt_len", [3, 14])  # shorter and longer than the window (6)
def test_ring_rows_equal_the_dense_reference(tiny_target, tiny_longspec, prompt_len):
    layer, embed, head = load_longspec(tiny_longspec)
    drafter = LongSpecDrafter(layer, embed, head)
    prompt = [(7 * i + 3) % 90 + 3 for i in range(prompt_len)]
    rows = target_kv(tiny_target, prompt[:-1])  # the target kept every position but the pending one
    (p,) = drafter.propose([DraftRequest("s", prompt, 4, GREEDY, features=rows)])
    seq = prompt + p.draft_token_ids
    for depth in range(4):  # draft token depth+1 came from row len(prompt) - 1 + depth, at lag depth + 1
        want = dense_rows(layer, embed, head, seq, rows, lag=depth + 1)[len(prompt) - 1 + depth]
        assert int(want.argmax()) == p.draft_token_ids[depth]
    # the same rows straight from the drafter, against the reference
    state = drafter.states["s"]
    got = drafter.logits(drafter._draft_hidden(DraftRequest("s", prompt, 4, GREEDY), state, p.draft_token_ids,
                                               [-1, 0, 1, 2], [0, 1, 2, 3]))
    for depth in range(1, 4):
        want = dense_rows(layer, embed, head, seq, rows, lag=depth + 1)[len(prompt) - 1 + depth]
        torch.testing.assert_close(got[depth - 1], want, atol=1e-4, rtol=1e-4)


def test_the_drafts_own_memory_is_constant_in_the_context(tiny_target, tiny_longspec):
    layer, embed, head = load_longspec(tiny_longspec)
    drafter = LongSpecDrafter(layer, embed, head)
    width = 2 * layer.config.num_kv_heads * layer.config.head_dim
    tokens, sizes, shapes = [5, 9], [], []
    for _ in range(30):
        drafter.propose([DraftRequest("s", tokens, 2, GREEDY, features=torch.randn(len(tokens) - 1 - (
            drafter.states["s"].mirror.length if "s" in drafter.states else 0), width))])
        ring = drafter.states["s"].ring
        sizes.append(drafter.draft_memory_bytes("s"))
        shapes.append((tuple(ring.kv.shape), tuple(ring.positions.shape)))
        tokens = tokens + [11, 12, 13]
    assert len(set(sizes)) == 1 and len(set(shapes)) == 1 and shapes[0][0][0] == layer.window
    assert drafter.mirror_bytes("s") == (len(tokens) - 4) * width * 4  # the target's KV grows, the draft's does not


def test_target_kv_rows_of_another_width_are_refused():
    mirror = TargetKVMirror(2, 8)
    with pytest.raises(ValueError, match="width 32"):
        mirror.append(torch.zeros(3, 40))


def test_more_target_rows_than_committed_positions_are_refused(tiny_longspec):
    drafter = LongSpecDrafter(*load_longspec(tiny_longspec))
    width = 2 * drafter.config.num_kv_heads * drafter.config.head_dim
    with pytest.raises(ValueError, match="committed"):
        drafter.propose([DraftRequest("s", [1, 2, 3], 2, GREEDY, features=torch.zeros(3, width))])


def test_a_trimmed_head_drafts_as_its_expanded_logits_would(tiny_target, tiny_longspec):
    """Over a VocabTrim subset, a chain draws from the kept ids' logits directly (greedy: their
    argmax, no [rows, vocab] expansion); the drafts and a sampled request's proposal distribution
    equal drawing from the expanded logits (-inf off the subset)."""
    import torch.nn.functional as F

    from specray.kernels.drafters.draft_model import sample_step

    layer, embed, head = load_longspec(tiny_longspec)
    kept = torch.randperm(head.shape[0], generator=torch.Generator().manual_seed(0))[:40]  # unsorted
    fast, reference = LongSpecDrafter(layer, embed, head, kept), LongSpecDrafter(layer, embed, head, kept)
    reference.head_logits = lambda h: reference.vocab.expand(F.linear(h, reference.head).float())
    reference._draw = sample_step  # the expanded rows, drawn over the whole vocabulary
    prompt = [(7 * i + 3) % 90 + 3 for i in range(14)]
    rows = target_kv(tiny_target, prompt[:-1])
    for sampling in (GREEDY, SamplingConfig(0.8)):
        got, want = (d.propose([DraftRequest("s", prompt, 4, sampling, features=rows,
                                             generator=torch.Generator().manual_seed(5))])[0]
                     for d in (fast, reference))
        assert got.draft_token_ids == want.draft_token_ids and set(got.draft_token_ids) <= set(kept.tolist())
        if sampling is GREEDY:
            assert got.draft_probs is None and want.draft_probs is None
        else:
            assert torch.equal(got.draft_probs, want.draft_probs)
        fast.release("s"), reference.release("s")
