"""Tensor-parallel shards (ranks as threads of this process) give the single-model logits."""

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from specray.kernels.batch import RaggedBatch, SeqChunk
from specray.kernels.loader import Checkpoint, load_model
from specray.kernels.tensor_parallel import check_shardable, shard_model, thread_groups
from specray.kernels.tp_group import TPGroup

pytestmark = pytest.mark.usefixtures("one_thread")


class StubGroup(TPGroup):
    """Rank/size only: enough to shard and inspect shapes, not to run a forward."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size



@pytest.fixture(scope="module")
def tied_96(tmp_path_factory):
    """vocab 96 splits over 2 and 4 ranks (vocab-parallel head, untied from the embedding);
    4 KV heads allow 4 ranks."""
    from helpers import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("tied_96"), seed=5, vocab_size=96, num_key_value_heads=4,
                           tie_word_embeddings=True)


def script(model):
    """Prefill two ragged sequences, verify chains on both, decode one row, verify a tree.
    -> logits of every step, concatenated [rows, vocab_size]."""
    cache = model.make_cache(32, block_size=4)
    out = []

    def step(chunks):
        out.append(model(RaggedBatch.build(chunks, cache), cache))
        for c in chunks:
            cache.set_cached(c.seq_id, c.context_len + len(c.token_ids))

    step([SeqChunk("a", [5, 17, 33, 2, 80, 41, 9], 0, num_logits=7), SeqChunk("b", [3, 4, 5], 0)])
    step([SeqChunk("a", [11, 12, 13, 14], 7, num_logits=4), SeqChunk("b", [60, 61], 3, num_logits=2)])
    step([SeqChunk("b", [62], 5)])  # one row: the GEMV path
    step([SeqChunk("a", [20, 21, 22, 23], 11, parents=[-1, 0, 0, 1], num_logits=4)])
    return torch.cat(out)


def run_ranks(folder, size):
    """Shard one model per rank, run `script` on every rank at once -> per-rank logits."""
    groups = thread_groups(size)
    models = [shard_model(load_model(Checkpoint(folder, "t"), gemv_weights=True), g) for g in groups]
    with ThreadPoolExecutor(size) as pool:
        return list(pool.map(script, models))


@pytest.mark.parametrize("size", [2, 4])
def test_vocab_parallel_tied_head_matches_single(tied_96, size):
    want = script(load_model(Checkpoint(tied_96, "t"), gemv_weights=True))
    outs = run_ranks(tied_96, size)
    for logits in outs:
        assert torch.equal(logits, outs[0]), "ranks must hold the same logits"
    torch.testing.assert_close(outs[0], want, atol=1e-5, rtol=1e-5)
    assert torch.equal(outs[0].argmax(-1), want.argmax(-1))


def test_replicated_head_matches_single(tiny_target):
    """vocab 97 does not split over 2: every rank keeps the whole LM head, no gather."""
    want = script(load_model(Checkpoint(tiny_target, "t")))
    outs = run_ranks(tiny_target, 2)
    assert torch.equal(outs[0], outs[1])
    torch.testing.assert_close(outs[0], want, atol=1e-5, rtol=1e-5)


def test_shard_shapes_slices_cache_and_gemv_copies(tiny_target):
    full = load_model(Checkpoint(tiny_target, "t"), gemv_weights=False)
    # GEMV copies serve unpacked weights only (no C kernels here)
    model = shard_model(load_model(Checkpoint(tiny_target, "t"), gemv_weights=True, cpu_kernels=False), StubGroup(1, 2))
    c, hd = full.config, full.config.head_dim
    assert model.config == c and not model.vocab_parallel
    assert (model.shard_config.num_heads, model.shard_config.num_kv_heads) == (c.num_heads // 2, c.num_kv_heads // 2)
    qkv, ref = model.layers[0].qkv_proj, full.layers[0].qkv_proj  # [q_rows + 2 * kv_rows, hidden_size]
    q_rows, kv_rows = c.q_size // 2, c.kv_size // 2
    torch.testing.assert_close(qkv[:q_rows], ref[q_rows:c.q_size], rtol=0, atol=0)  # query heads 2, 3
    torch.testing.assert_close(qkv[q_rows:q_rows + kv_rows], ref[c.q_size + hd:c.q_size + 2 * hd], rtol=0, atol=0)
    torch.testing.assert_close(qkv[-kv_rows:], ref[-hd:], rtol=0, atol=0)  # value head 1
    torch.testing.assert_close(model.layers[0].o_proj, full.layers[0].o_proj[:, c.q_size // 2:], rtol=0, atol=0)
    inter = c.intermediate_size // 2
    gate_up = model.layers[0].gate_up_proj  # [2 * inter, hidden_size]
    torch.testing.assert_close(gate_up[inter:], full.layers[0].gate_up_proj[-inter:], rtol=0, atol=0)
    torch.testing.assert_close(model.layers[0].down_proj, full.layers[0].down_proj[:, inter:], rtol=0, atol=0)
    assert model.make_cache(4, 4).kv.shape == (c.num_layers, 2 * c.num_kv_heads // 2, 16, hd)
    for layer in model.layers:  # the GEMV copies follow the new weights
        for w in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj):
            assert torch.equal(model.gemv_weights[id(w)], w.t())
    assert len(model.gemv_weights) == 4 * c.num_layers + 1


def test_indivisible_shapes_are_a_clear_error(tiny_target):
    model = load_model(Checkpoint(tiny_target, "t"))
    with pytest.raises(ValueError, match=r"divisible by 3, got num_kv_heads=2, intermediate_size=128"):
        shard_model(model, StubGroup(0, 3))
    with pytest.raises(ValueError, match=r"divisible by 2, got intermediate_size=129$"):
        check_shardable(dataclasses.replace(model.config, intermediate_size=129), 2)
    with pytest.raises(ValueError, match="rank must be in"):
        shard_model(model, StubGroup(2, 2))
    assert model.tp_group.size == 1 and model.layers[0].qkv_proj.shape[0] == 128  # left whole
