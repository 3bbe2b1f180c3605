"""The runtime matches transformers' logits (fp32, CPU) within 1e-4, on ragged batches."""

import pytest
import torch

from specray.kernels.batch import RaggedBatch, SeqChunk
from specray.kernels.config import ModelConfig, UnsupportedModelError
from specray.kernels.loader import Checkpoint, load_model


def hf_logits(folder, ids):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]  # [seq, vocab]


def run(model, cache, chunks, reference=False):
    return model(RaggedBatch.build(chunks, cache), cache, reference=reference)


@pytest.mark.parametrize("reference", [False, True])
def test_prefill_matches_transformers(tiny_target, reference):
    model = load_model(Checkpoint(tiny_target, "t"))
    ids = [5, 17, 33, 2, 80, 41, 9]
    cache = model.make_cache(8, block_size=4)
    logits = run(model, cache, [SeqChunk("a", ids, 0, num_logits=len(ids))], reference)
    torch.testing.assert_close(logits, hf_logits(tiny_target, ids), atol=1e-4, rtol=1e-4)


def test_ragged_incremental_batch_matches_transformers(tiny_target):
    """Two sequences with different context lengths and new-token counts in one step."""
    model = load_model(Checkpoint(tiny_target, "t"))
    cache = model.make_cache(16, block_size=3)
    a, b = [3, 4, 5, 6, 7, 8, 9], [10, 11, 12, 13, 14]
    run(model, cache, [SeqChunk("a", a[:2], 0), SeqChunk("b", b[:4], 0)])
    cache.set_cached("a", 2)
    cache.set_cached("b", 4)
    logits = run(model, cache, [SeqChunk("a", a[2:], 2, num_logits=5), SeqChunk("b", b[4:], 4)])
    torch.testing.assert_close(logits[:5], hf_logits(tiny_target, a)[2:], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[5:], hf_logits(tiny_target, b)[4:], atol=1e-4, rtol=1e-4)


def test_rollback_is_a_length_update(tiny_target):
    """Writing rejected tokens, then truncating and writing others, gives the clean logits."""
    model = load_model(Checkpoint(tiny_target, "t"))
    cache = model.make_cache(8, block_size=4)
    run(model, cache, [SeqChunk("a", [1, 2, 3, 4], 0)])
    cache.set_cached("a", 4)
    run(model, cache, [SeqChunk("a", [50, 51, 52], 4)])  # rejected draft tokens
    cache.set_cached("a", 4)
    logits = run(model, cache, [SeqChunk("a", [7, 8], 4, num_logits=2)])
    torch.testing.assert_close(logits, hf_logits(tiny_target, [1, 2, 3, 4, 7, 8])[4:], atol=1e-4, rtol=1e-4)


def test_tree_matches_each_root_to_leaf_path(tiny_target):
    """Tree attention equals running every root-to-leaf path as its own chain."""
    model = load_model(Checkpoint(tiny_target, "t"))
    prompt = [9, 8, 7, 6, 5]
    tokens, parents = [20, 21, 22, 23, 24, 25], [-1, 0, 0, 1, 2, 2]
    cache = model.make_cache(32, block_size=4)
    run(model, cache, [SeqChunk("t", prompt, 0)])
    cache.set_cached("t", len(prompt))
    tree = run(model, cache, [SeqChunk("t", tokens, len(prompt), parents, num_logits=6)])
    ref = run(model, cache, [SeqChunk("t", tokens, len(prompt), parents, num_logits=6)], reference=True)
    torch.testing.assert_close(tree, ref, atol=1e-4, rtol=1e-4)
    for leaf in (3, 4, 5):
        path = [leaf]
        while parents[path[0]] >= 0:
            path.insert(0, parents[path[0]])
        want = hf_logits(tiny_target, prompt + [tokens[i] for i in path])[len(prompt):]
        torch.testing.assert_close(tree[path], want, atol=1e-4, rtol=1e-4)


def test_llama3_rope_scaling_matches_transformers(tmp_path):
    from helpers import save_tiny_llama

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    folder = save_tiny_llama(tmp_path / "m", seed=3, rope_scaling=scaling, tie_word_embeddings=True)
    model = load_model(Checkpoint(folder, "t"))
    ids = list(range(3, 90))
    logits = run(model, model.make_cache(32, 4), [SeqChunk("a", ids, 0, num_logits=len(ids))])
    torch.testing.assert_close(logits, hf_logits(folder, ids), atol=1e-4, rtol=1e-4)


def test_unsupported_architecture_is_a_clear_error():
    class Cfg:
        model_type = "gpt2"

    with pytest.raises(UnsupportedModelError, match="gpt2"):
        ModelConfig.from_hf(Cfg())


def test_rotation_matrix_matches_reference_rope():
    from specray.kernels.rope import RotaryTable, apply_rotary

    cfg = ModelConfig(vocab_size=10, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=4,
                      num_kv_heads=2, head_dim=8, rms_norm_eps=1e-6, rope_theta=10000.0,
                      max_position_embeddings=64, tie_word_embeddings=True)
    table = RotaryTable(cfg, torch.float32)
    pos = torch.tensor([0, 3, 17, 63])
    x = torch.randn(4, 6, 8)
    cos, sin = table.lookup(pos)
    torch.testing.assert_close(torch.bmm(x, table.rotation(pos)), apply_rotary(x, cos, sin))


def test_gemv_weights_match_the_plain_projection(tiny_target):
    """The one-row fast path (transposed weight copies) equals F.linear on the original layout."""
    plain = load_model(Checkpoint(tiny_target, "t"), gemv_weights=False, cpu_kernels=False)
    fast = load_model(Checkpoint(tiny_target, "t"), gemv_weights=True, cpu_kernels=False)  # unpacked weights
    assert not plain.gemv_weights and fast.gemv_weights
    outs = []
    for model in (plain, fast):
        cache = model.make_cache(8, block_size=4)
        run(model, cache, [SeqChunk("a", [4, 5, 6], 0)])
        cache.set_cached("a", 3)
        outs.append(run(model, cache, [SeqChunk("a", [7], 3)]))  # one row: the GEMV path
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)


def test_split_projection_matches_the_plain_projection(tiny_target):
    """4..12 rows over a weight taller than SPLIT_ROWS go through row slices; same products."""
    from specray.kernels.model import SPLIT_ROWS

    fast = load_model(Checkpoint(tiny_target, "t"), gemv_weights=True)
    weight = torch.randn(2 * SPLIT_ROWS + 7, 48)
    for rows in (1, 2, 4, 9, 12, 13):
        x = torch.randn(rows, 48)
        got = fast.linear(x, weight)
        assert got.shape == (rows, weight.shape[0])
        torch.testing.assert_close(got, torch.nn.functional.linear(x, weight), atol=1e-5, rtol=1e-5)
