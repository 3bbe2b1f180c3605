"""Chat templates to token ids, the same under every supported transformers."""

from __future__ import annotations


def chat_token_ids(tokenizer, messages: list[dict[str, str]], add_generation_prompt: bool = True,
                   continue_final_message: bool = False) -> list[int]:
    """The conversation as token ids: with the assistant's turn opened (add_generation_prompt), or
    ending inside the last message for the model to continue (continue_final_message: a prefilled
    reply), as vLLM's options. transformers 4 returns the ids; 5 returns a BatchEncoding, which
    `list()` would turn into its keys."""
    if add_generation_prompt and continue_final_message:
        raise ValueError("continue_final_message continues the last message, add_generation_prompt opens a new "
                         "one: set add_generation_prompt to false")
    try:
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True,
                                            continue_final_message=continue_final_message)
    except Exception as e:
        from jinja2 import TemplateError  # transformers renders chat templates with jinja2

        if not isinstance(e, TemplateError):
            raise
        # the template's own refusal (raise_exception: roles must alternate, no system role, ...)
        raise ValueError(f"the chat template refused the conversation: {e}") from None
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return [int(t) for t in out]


def prompt_token_ids(tokenizer, prompt: str) -> list[int]:
    """One user turn, chat-templated."""
    return chat_token_ids(tokenizer, [{"role": "user", "content": prompt}])
