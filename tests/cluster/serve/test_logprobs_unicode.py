"""Logprobs of characters split over tokens (emoji, CJK) with SmolLM2's byte-level tokenizer: chat's
`bytes` join to the text, as OpenAI's do, and the completions API's `text_offset` never passes it."""

import pytest

from specray.cluster.serve.openai_logprobs import BYTE_LEVEL, chat_logprobs, completion_logprobs

from smollm2_helpers import needs_smollm2

pytestmark = needs_smollm2
TEXTS = ["Here are some emoji: 😀😃🎉🚀 and 漢字", "🎉🎉🎉🎉 done", "日本語のテキストです。", "plain words only"]


@pytest.fixture(scope="module")
def tokenizer():
    from specray.kernels.loader import resolve

    return resolve("smollm2-135m").tokenizer()


def test_the_byte_level_alphabet_is_a_bijection():
    assert sorted(BYTE_LEVEL.values()) == list(range(256)) and BYTE_LEVEL["!"] == ord("!")
    assert BYTE_LEVEL["Ġ"] == ord(" ")  # byte-level BPE's space


@pytest.mark.parametrize("text", TEXTS)
def test_chat_bytes_join_to_the_text(tokenizer, text):
    ids = tokenizer(text).input_ids
    content = chat_logprobs(tokenizer, ids, [{t: -0.5} for t in ids], 0)["content"]
    assert bytes(b for entry in content for b in entry["bytes"]).decode("utf-8") == tokenizer.decode(ids) == text


@pytest.mark.parametrize("text", TEXTS)
def test_completion_offsets_stay_on_the_text(tokenizer, text):
    ids = tokenizer(text).input_ids
    lp, end = completion_logprobs(tokenizer, ids, [{t: -0.5} for t in ids], 0, 0)
    assert end == len(text) and lp["text_offset"] == sorted(lp["text_offset"])
    assert all(text[o:].startswith(tok) for o, tok in zip(lp["text_offset"], lp["tokens"]) if "\ufffd" not in tok)


@pytest.mark.parametrize("prompt", ["🍕 is tasty", "日本 is Japan", "<|im_start|>user\nhi<|im_end|>\n",
                                    "Hello<|endoftext|> world"])
def test_an_echoed_prompt_s_offsets_index_it(tokenizer, prompt):
    """A first token inside a character counted as one (U+FFFD); special tokens were read skipped
    while the echo shows the prompt as sent."""
    from specray.cluster.outputs import CompletionOutput, RequestOutput
    from specray.cluster.serve.openai_completions import Echo

    ids = tokenizer(prompt).input_ids
    out = RequestOutput("r", prompt, ids, [CompletionOutput(0, "", [])], True,
                        prompt_logprobs=[None] + [{t: -1.0} for t in ids[1:]])
    echo = Echo(tokenizer, 0, skip=True)
    text, lp = echo.text(out), echo.prompt_logprobs(out)
    assert text == prompt and len(lp["tokens"]) == len(ids) and lp["token_logprobs"][0] is None
    assert lp["text_offset"] == sorted(lp["text_offset"]) and max(lp["text_offset"]) < len(text)
    assert all(text[o:].startswith(t) for o, t in zip(lp["text_offset"], lp["tokens"]) if "\ufffd" not in t)
