"""Prompts to token ids for the served APIs: checked before tokenising, tokenised off the event loop.

A long text costs seconds of tokenisation; on the replica's event loop that would stall every other
request, so it runs on a small thread pool. A text longer than any context could hold is refused
before it is tokenised at all: no token covers more characters than the vocabulary's longest
token string has (byte-level BPE: bytes), so a longer text is certainly too many tokens.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from specray.cluster.params import kept_length
from specray.kernels.chat import chat_token_ids
from specray.kernels.ints import ceil_div

NORMALIZER_SLACK = 2  # a normalizer may shorten text (composed characters) before the tokens are cut


CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")  # what every entry point takes


class PromptError(ValueError):
    """A prompt refused before it reached the router; `param` names the request field."""

    def __init__(self, message: str, param: str):
        super().__init__(f"{param}: {message}")
        self.param = param


def check_text(text: str, param: str, max_chars: int | None = None) -> None:
    """Valid Unicode (no unpaired surrogates: JSON's \\ud800 escapes allow them) and not absurdly long."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise PromptError(f"not valid Unicode text (unpaired surrogate at character {e.start})", param) from None
    if max_chars is not None and len(text) > max_chars:
        raise PromptError(f"{len(text)} characters cannot fit the model's context; at most {max_chars}", param)


def check_room(prompt_tokens: int, max_tokens: int, max_model_len: int, param: str = "max_tokens",
               block: int = 1) -> None:
    """A max_tokens the client asked for must fit beside the prompt (as OpenAI and vLLM answer);
    the server's default is cut to the room left instead. A prompt that fills the context alone is
    the prompt's fault whatever max_tokens says (for a diffusion LM, one that leaves no whole block):
    the router's own check refuses it, naming it. A diffusion LM's canvas is whole blocks of `block`
    tokens: max_tokens counts rounded up to them."""
    canvas = ceil_div(max_tokens, block) * block
    if prompt_tokens + block <= max_model_len and prompt_tokens + canvas > max_model_len:
        asked = f"{prompt_tokens + canvas} ({prompt_tokens} in the prompt, {max_tokens} to generate"
        asked += f", a canvas of {canvas}: whole blocks of {block})" if block > 1 else ")"
        raise PromptError(f"the model's context is {max_model_len} tokens; this request asks for {asked}: "
                          f"lower {param} or shorten the prompt", param)


class PromptEncoder:
    def __init__(self, tokenizer, max_model_len: int, threads: int = 2, block: int = 1):
        self.tokenizer, self.max_model_len, self.block = tokenizer, max_model_len, block
        longest = max((len(t) for t in tokenizer.get_vocab()), default=1)
        self.max_chars = max_model_len * longest * NORMALIZER_SLACK
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="specray-tokenize")
        # responses' logprob texts: apart, so that a long one does not hold back new prompts' tokenizing
        self._render = ThreadPoolExecutor(1, thread_name_prefix="specray-render")

    @classmethod
    def for_limits(cls, tokenizer, limits) -> "PromptEncoder":
        """For a router's limits: its context, and a diffusion LM's canvas blocks (RouterLimits has none)."""
        return cls(tokenizer, limits.max_model_len, block=getattr(limits, "block_length", 1))

    def check_room(self, prompt_tokens: int, max_tokens: int, param: str = "max_tokens",
                   truncate: int | None = None) -> None:
        """`truncate`: the request's truncate_prompt_tokens (the room is what the kept tokens leave)."""
        kept = kept_length(prompt_tokens, truncate, self.max_model_len)
        check_room(kept, max_tokens, self.max_model_len, param, self.block)

    def _max_chars(self, truncate: int | None) -> int | None:
        """Text past the context is refused before tokenising, unless the request cuts its prompt
        (then the body's size limit bounds it)."""
        return self.max_chars if truncate is None else None

    async def text(self, text: str, param: str = "prompt", truncate: int | None = None) -> list[int]:
        check_text(text, param, self._max_chars(truncate))
        return await self._run(lambda: list(self.tokenizer(text).input_ids))

    async def chat(self, messages: list[dict[str, str]], param: str = "messages", truncate: int | None = None,
                   **template: bool) -> list[int]:
        """`template`: chat_token_ids' add_generation_prompt and continue_final_message."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise PromptError("this model has no chat template; send a completion prompt instead", param)
        max_chars = self._max_chars(truncate)
        for i, m in enumerate(messages):
            check_text(m["content"], f"{param}[{i}].content", max_chars)
        if max_chars is not None and sum(len(m["content"]) for m in messages) > max_chars:
            raise PromptError(f"the conversation cannot fit the model's context; at most {self.max_chars} "
                              "characters", param)
        try:
            return await self._run(lambda: chat_token_ids(self.tokenizer, messages, **template))
        except ValueError as e:  # e.g. a template that does not render the message to continue as sent
            raise PromptError(str(e), param) from None

    async def _run(self, fn):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    async def render(self, fn, decodes: bool):
        """`fn()`, on a thread of its own where it `decodes` logprobs: a long prompt's (a decode per
        position and top-n entry) held the event loop, and every stream on it, for minutes."""
        if not decodes:
            return fn()
        return await asyncio.get_running_loop().run_in_executor(self._render, fn)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._render.shutdown(wait=False, cancel_futures=True)
