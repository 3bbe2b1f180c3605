"""The completions API's choices: the text and its logprobs, an echoed prompt (`echo`), and vLLM's
`prompt_logprobs`; whole, or a stream's echo chunk."""

from __future__ import annotations

from dataclasses import dataclass, replace

from specray.cluster.outputs import CompletionOutput, RequestOutput
from specray.cluster.serve.openai_logprobs import completion_logprobs, echo_logprobs, joined, vllm_prompt_logprobs


@dataclass
class Echo:
    """`echo: true`: each choice begins with its prompt, as the legacy completions API gives it."""

    tokenizer: object
    logprobs: int | None  # the request's logprobs: the prompt's too, its first token's null
    skip: bool  # skip_special_tokens, as for the completion's text

    @classmethod
    def of(cls, body, tokenizer, skip: bool) -> "Echo | None":
        return cls(tokenizer, body.logprobs, skip) if body.echo else None

    def text(self, out: RequestOutput) -> str:
        """The prompt as sent (a string), or its tokens decoded (token ids)."""
        if out.prompt is not None:
            return out.prompt
        return self.tokenizer.decode(out.prompt_token_ids, skip_special_tokens=self.skip)

    def prompt_logprobs(self, out: RequestOutput) -> dict | None:
        """A string prompt's tokens read with their special tokens, as the echoed text has them, so
        the offsets index it."""
        if self.logprobs is None:
            return None
        skip = self.skip and out.prompt is None
        return echo_logprobs(self.tokenizer, out.prompt_token_ids, out.prompt_logprobs, self.logprobs, skip)

    def chunk(self, index: int, out: RequestOutput) -> dict:
        """A stream's first chunk of a choice: its prompt."""
        return {"index": index, "text": self.text(out), "finish_reason": None, "stop_reason": None,
                "logprobs": self.prompt_logprobs(out)}


def prompt_only(out: RequestOutput) -> RequestOutput:
    """`echo` with `max_tokens: 0` (the legacy API's way to score a prompt): the run draws one token,
    which no choice keeps."""
    kept = [replace(c, text="", token_ids=[], logprobs=None if c.logprobs is None else [],
                    finish_reason="length" if c.finish_reason else None, stop_reason=None, cumulative_logprob=None)
            for c in out.outputs]
    return replace(out, outputs=kept)


async def prompts_only(runs):
    async for out in runs:
        yield prompt_only(out)


def completion_choice(tokenizer, body, params, base: int, out: RequestOutput, c: CompletionOutput) -> dict:
    """Choice `base + c.index` of an unstreamed completions response."""
    echo = Echo.of(body, tokenizer, params.skip_special_tokens)
    prefix = "" if echo is None else echo.text(out)
    logprobs, _ = completion_logprobs(tokenizer, c.token_ids, c.logprobs, 0, len(prefix), params.skip_special_tokens,
                                      out.prompt_token_ids)
    choice = {"index": base + c.index, "text": prefix + c.text, "finish_reason": c.finish_reason,
              "stop_reason": c.stop_reason,
              "logprobs": logprobs if echo is None else joined(echo.prompt_logprobs(out), logprobs)}
    if body.prompt_logprobs is not None:
        choice["prompt_logprobs"] = vllm_prompt_logprobs(tokenizer, out.prompt_token_ids, out.prompt_logprobs,
                                                         body.prompt_logprobs)
    return choice
