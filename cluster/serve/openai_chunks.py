"""The OpenAI streaming chunks (completions and chat) from the engine's outputs, and the usage
object every response carries."""

from __future__ import annotations

from collections.abc import AsyncIterator

from specray.cluster.outputs import RequestOutput
from specray.cluster.serve.deltas import ChoiceDeltas
from specray.cluster.serve.merge import side_by_side
from specray.cluster.serve.openai_completions import Echo
from specray.cluster.serve.openai_logprobs import CompletionDeltas, chat_logprobs, vllm_prompt_logprobs


def chat_choices(tokenizer, out: RequestOutput, params, role: str, echoed: str,
                 prompt_logprobs: int | None) -> tuple[list[dict], dict]:
    """An unstreamed chat response's choices, and vLLM's prompt_logprobs beside them ({} without)."""
    choices = [{"index": c.index, "message": {"role": role, "content": echoed + c.text},
                "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,
                "logprobs": chat_logprobs(tokenizer, c.token_ids, c.logprobs, params.logprobs,
                                          skip=params.skip_special_tokens, prompt_ids=out.prompt_token_ids)}
               for c in out.outputs]
    return choices, {} if prompt_logprobs is None else {
        "prompt_logprobs": vllm_prompt_logprobs(tokenizer, out.prompt_token_ids, out.prompt_logprobs,
                                                prompt_logprobs)}


def usage_body(outs: list[RequestOutput]) -> dict:
    """The OpenAI usage object of a response's outputs, with speculation's counts."""
    prompt = sum(len(o.prompt_token_ids) for o in outs)
    completion = sum(len(c.token_ids) for o in outs for c in o.outputs)
    m = [o.metrics for o in outs]
    rounds, emitted = sum(x.num_rounds for x in m), sum(x.num_emitted_tokens for x in m)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(o.num_cached_tokens for o in outs)},
            "speculative": {"num_draft_tokens": sum(x.num_draft_tokens for x in m),
                            "num_accepted_tokens": sum(x.num_accepted_tokens for x in m),
                            "acceptance_length": round(emitted / rounds, 4) if rounds else None}}


async def completion_chunks(run, tokenizer, model_name: str, rid: str, created: int, inputs, params, n: int,
                            include_usage: bool, echo: Echo | None = None, render=None) -> AsyncIterator[dict]:
    """A completions stream's chunks: `inputs` [(prompt text, ids, the field errors name)] run side
    by side through `run` (OpenAIServer._run); choice i * n + j is prompt i's j-th; with `echo`,
    each choice's first chunk is its prompt (its logprobs rendered by `render(fn, decodes)` where given)."""
    head = {"id": rid, "object": "text_completion", "created": created, "model": model_name}
    usage = {"usage": None} if include_usage else {}  # OpenAI's: null on every chunk before the usage one
    finals, deltas = [], [CompletionDeltas() for _ in inputs]
    # the prompts of one request run together, as unstreamed ones do
    async for i, out in side_by_side([run(ids, params, text, name) for text, ids, name in inputs]):
        if out.finished:
            finals.append(out)
        for c in out.outputs:
            if (new := deltas[i].take(c)) is None:
                continue
            if echo is not None and c.index not in deltas[i].offsets:  # the choice's first chunk
                chunk = lambda: echo.chunk(i * n + c.index, out)  # noqa: E731 - every prompt position's logprobs
                first = chunk() if render is None else await render(chunk, echo.logprobs is not None)
                deltas[i].offsets[c.index] = len(first["text"])
                yield {**head, "choices": [first], **usage}
            delta, k0 = new
            yield {**head, "choices": [{"index": i * n + c.index, "text": delta, "finish_reason": c.finish_reason,
                                        "stop_reason": c.stop_reason,
                                        "logprobs": deltas[i].completion_logprobs(tokenizer, c, k0,
                                                                                  params.skip_special_tokens,
                                                                                  out.prompt_token_ids)}],
                   **usage}
    if include_usage and finals:
        yield {**head, "choices": [], "usage": usage_body(finals)}

async def chat_chunks(run, tokenizer, model_name: str, rid: str, created: int, ids: list[int], params,
                      include_usage: bool, role: str = "assistant", echoed: str = "") -> AsyncIterator[dict]:
    """A chat stream's chunks: the role chunks once the engine took the request (each followed by the
    echoed last message, if any, as vLLM sends it), then the deltas."""
    head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model_name,
            **({"usage": None} if include_usage else {})}  # as in completions
    deltas, last = ChoiceDeltas(), None
    async for out in run(ids, params, None, "messages"):
        if last is None:  # the role chunks wait for the engine to take the request
            for j in range(params.n):
                yield {**head, "choices": [{"index": j, "delta": {"role": role, "content": ""},
                                            "logprobs": None, "finish_reason": None}]}
                if echoed:
                    yield {**head, "choices": [{"index": j, "delta": {"content": echoed}, "logprobs": None,
                                                "finish_reason": None}]}
        last = out
        for c in out.outputs:
            if (new := deltas.take(c)) is None:
                continue
            delta, k0 = new
            lps = None if c.logprobs is None else c.logprobs[k0:]
            yield {**head, "choices": [{"index": c.index, "delta": {"content": delta} if delta else {},
                                        "logprobs": chat_logprobs(tokenizer, c.token_ids, lps,
                                                                  params.logprobs, k0,
                                                                  params.skip_special_tokens,
                                                                  out.prompt_token_ids),
                                        "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}]}
    if include_usage and last is not None:
        yield {**head, "choices": [], "usage": usage_body([last])}
