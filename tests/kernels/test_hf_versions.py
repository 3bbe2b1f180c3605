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

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and tokenize
        ids = [1, *(len(m["content"]) for m in messages), 2]
        return {"input_ids": ids, "attention_mask": [1] * len(ids)} if self.as_dict else ids


@pytest.mark.parametrize("as_dict", [False, True])  # 4 returns the ids, 5 a BatchEncoding
def test_chat_token_ids_from_either_return_type(as_dict):
    tok = _Tokenizer(as_dict)
    assert chat_token_ids(tok, [{"role": "user", "content": "abc"}]) == [1, 3, 2]
    assert prompt_token_ids(tok, "hello") == [1, 5, 2]
