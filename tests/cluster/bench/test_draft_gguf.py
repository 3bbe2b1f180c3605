"""A standalone draft written as a GGUF file for llama.cpp's speculation rows: transformers' own GGUF
reader (which undoes llama.cpp's rotary row order) gives back the checkpoint's logits exactly; the
tokenizer comes from the target's GGUF; a draft llama.cpp could not pair with the target is refused."""

import gguf
import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specray.cluster.bench import draft_gguf
from specray.cluster.bench.draft_gguf import cached_draft_gguf, rope_rows_interleaved, write_draft_gguf

VOCAB = 96


def tiny_target_gguf(path, vocab=VOCAB):
    """A GGUF holding only a toy tokenizer: what the draft's file copies from its target."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(vocab)])
    writer.add_token_types([1] * vocab)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_tensor("token_embd.weight", np.zeros((vocab, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def tiny_draft(folder, tied: bool):
    torch.manual_seed(0)
    # head_dim 16 is not hidden / heads (12), as in the packaged SmolLM2 draft
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=48, num_attention_heads=4, head_dim=16, num_key_value_heads=2,
                         num_hidden_layers=2, intermediate_size=64, rope_theta=10000.0, tie_word_embeddings=tied)
    model = LlamaForCausalLM(config).to(torch.float16)
    model.save_pretrained(folder)
    return LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def read_back(path, config):
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    model = LlamaForCausalLM(config).eval()
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    missing = model.load_state_dict(tensors, strict=False).missing_keys
    assert missing == (["lm_head.weight"] if config.tie_word_embeddings else [])
    model.tie_weights()
    return model


@pytest.mark.parametrize("tied", [True, False])
def test_the_gguf_gives_back_the_drafts_logits(tmp_path, tied):
    reference = tiny_draft(tmp_path / "draft", tied)
    out = write_draft_gguf(tmp_path / "draft", tiny_target_gguf(tmp_path / "target.gguf"), tmp_path / "draft.gguf")
    ids = torch.tensor([[1, 5, 17, 40, 3, 88, 61, 9]])
    with torch.no_grad():
        want = reference(ids).logits
        got = read_back(out, reference.config)(ids).logits
    torch.testing.assert_close(got, want, atol=0, rtol=0)  # fp16 weights stored as fp16: nothing rounds
    fields = gguf.GGUFReader(str(out)).fields
    assert fields["tokenizer.ggml.tokens"].contents()[:2] == ["t0", "t1"]
    assert fields["llama.attention.key_length"].contents() == 16
    assert fields["tokenizer.ggml.eos_token_id"].contents() == 2


def test_without_the_rotary_row_order_the_logits_differ(tmp_path, monkeypatch):
    """Negative control: the rows left in transformers' order make another model."""
    reference = tiny_draft(tmp_path / "draft", tied=True)
    monkeypatch.setattr(draft_gguf, "rope_rows_interleaved", lambda w, heads: w)
    out = write_draft_gguf(tmp_path / "draft", tiny_target_gguf(tmp_path / "target.gguf"), tmp_path / "draft.gguf")
    ids = torch.tensor([[1, 5, 17, 40, 3, 88, 61, 9]])
    with torch.no_grad():
        assert not torch.allclose(read_back(out, reference.config)(ids).logits, reference(ids).logits, atol=1e-3)


def test_rotary_rows_pair_dimension_i_with_i_plus_half():
    rows = torch.arange(8.0).reshape(8, 1)  # one head of 8 dimensions: transformers pairs (0, 4), (1, 5), ...
    assert rope_rows_interleaved(rows, heads=1).flatten().tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    two_heads = rope_rows_interleaved(torch.arange(8.0).reshape(8, 1), heads=2).flatten().tolist()
    assert two_heads == [0, 2, 1, 3, 4, 6, 5, 7]


def test_a_draft_llama_cpp_cannot_pair_is_refused(tmp_path):
    tiny_draft(tmp_path / "draft", tied=True)
    with pytest.raises(ValueError, match="vocabulary 96 differs from the target's 50"):
        write_draft_gguf(tmp_path / "draft", tiny_target_gguf(tmp_path / "t.gguf", vocab=50), tmp_path / "d.gguf")
    config = (tmp_path / "draft" / "config.json")
    config.write_text(config.read_text().replace('"model_type": "llama"', '"model_type": "qwen2"'))
    with pytest.raises(ValueError, match="must be a Llama checkpoint"):
        write_draft_gguf(tmp_path / "draft", tmp_path / "t.gguf", tmp_path / "d.gguf")


def test_the_cache_writes_a_draft_once(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRAY_CACHE", str(tmp_path / "cache"))
    tiny_draft(tmp_path / "draft", tied=True)
    target = tiny_target_gguf(tmp_path / "target.gguf")
    first = cached_draft_gguf(tmp_path / "draft", target)
    stamp = first.stat().st_mtime_ns
    assert cached_draft_gguf(tmp_path / "draft", target) == first and first.stat().st_mtime_ns == stamp
    assert first.parent == tmp_path / "cache" / "llama.cpp" / "drafts" and not list(first.parent.glob("*.partial"))
