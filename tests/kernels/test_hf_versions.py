"""What differs between transformers 4 and 5 and is read through one helper each: the RoPE base and
scaling of a config, and a chat template's token ids. Both shapes are built here, so the default
resolution tests the other major's too."""

from types import SimpleNamespace

import pytest

from specray.kernels.chat import chat_token_ids, prompt_token_ids
from specray.kernels.config import rope_params

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}


@pytest.mark.parametrize("config, want", [
    (SimpleNamespace(rope_theta=100000.0, rope_scaling=None), (100000.0, None)),  # transformers 4
    (SimpleNamespace(rope_theta=5e5, rope_scaling=LLAMA3), (5e5, LLAMA3)),
    # transformers 5: no rope_theta attribute; rope_scaling aliases rope_parameters
    (SimpleNamespace(rope_parameters={"rope_theta": 100000.0, "rope_type": "default"},
                     rope_scaling={"rope_theta": 100000.0, "rope_type": "default"}), (100000.0, None)),
    (SimpleNamespace(rope_parameters={"rope_theta": 5e5, **LLAMA3}), (5e5, LLAMA3)),
    (SimpleNamespace(), (10000.0, None)),
])
def test_rope_params_read_both_layouts(config, want):
    assert rope_params(config) == want


class _Tokenizer:
    def __init__(self, as_dict: bool):
        self.as_dict = as_dict

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, continue_final_message):
        assert add_generation_prompt and tokenize and not continue_final_message
        ids = [1, *(len(m["content"]) for m in messages), 2]
        return {"input_ids": ids, "attention_mask": [1] * len(ids)} if self.as_dict else ids


@pytest.mark.parametrize("as_dict", [False, True])  # 4 returns the ids, 5 a BatchEncoding
def test_chat_token_ids_from_either_return_type(as_dict):
    tok = _Tokenizer(as_dict)
    assert chat_token_ids(tok, [{"role": "user", "content": "abc"}]) == [1, 3, 2]
    assert prompt_token_ids(tok, "hello") == [1, 5, 2]


def test_a_hidden_size_no_multiple_of_the_heads_builds_loads_and_tokenizes(tiny_target, tmp_path):
    """transformers 5 refuses hidden 32 over 3 heads even with head_dim given; the packaged
    standalone draft has that shape (256 over 9 heads of 64): its config, the draft distill builds, a
    folder saved with it, its tokenizer and the benchmark's transformers loader all work."""
    from types import SimpleNamespace

    from transformers import LlamaForCausalLM

    from specray.cluster.bench.hf_baselines import load_hf
    from specray.cluster.distill.model import draft_config, write_draft_folder
    from specray.kernels.loader import Checkpoint, hf_config, llama_config

    config = llama_config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=3, num_key_value_heads=1, head_dim=16)
    assert (config.hidden_size, config.head_dim) == (32, 16)
    target = SimpleNamespace(**{k: getattr(config, k) for k in (
        "vocab_size", "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
        "rms_norm_eps", "bos_token_id", "eos_token_id", "pad_token_id")}, rope_theta=10000.0, rope_scaling=None,
        hidden_size=48, intermediate_size=64)
    assert draft_config(target, 32, 1, 64).hidden_size == 32
    model = LlamaForCausalLM(config)
    write_draft_folder(tmp_path, model.state_dict(), {**config.to_dict(), "model_type": "llama"}, tiny_target)
    assert hf_config(tmp_path).hidden_size == 32
    assert load_hf(tmp_path).model.layers[0].self_attn.q_proj.weight.shape == (48, 32)
    assert Checkpoint(tmp_path, "draft").tokenizer()("a b").input_ids
