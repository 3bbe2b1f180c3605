"""Chat templates to token ids, the same under every supported transformers."""

from __future__ import annotations


def chat_token_ids(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """The conversation with the assistant's turn opened, as token ids. transformers 4 returns the
    ids; 5 returns a BatchEncoding, which `list()` would turn into its keys."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return [int(t) for t in out]


def prompt_token_ids(tokenizer, prompt: str) -> list[int]:
    """One user turn, chat-templated."""
    return chat_token_ids(tokenizer, [{"role": "user", "content": prompt}])
