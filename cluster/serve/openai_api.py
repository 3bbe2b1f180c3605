"""OpenAI-compatible HTTP API (FastAPI) over an AsyncRouter: /v1/completions, /v1/chat/completions
(SSE streaming or not), /v1/models, /health, /metrics. A plain class: Ray Serve wraps it in the
builder module, `uvicorn` can serve it directly."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from specray.cluster.outputs import RequestOutput
from specray.cluster.router.async_router import AsyncRouter
from specray.cluster.serve import errors
from specray.cluster.serve.auth import authorized
from specray.cluster.serve.errors import CLIENT_ERRORS, status_of
from specray.cluster.serve.metrics import ServingMetrics
from specray.cluster.serve.openai_protocol import ApiError, ChatRequest, CompletionRequest
from specray.kernels.chat import chat_token_ids


def _usage(outs: list[RequestOutput]) -> dict:
    prompt = sum(len(o.prompt_token_ids) for o in outs)
    completion = sum(len(c.token_ids) for o in outs for c in o.outputs)
    m = [o.metrics for o in outs]
    rounds, emitted = sum(x.num_rounds for x in m), sum(x.num_emitted_tokens for x in m)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "speculative": {"num_draft_tokens": sum(x.num_draft_tokens for x in m),
                            "num_accepted_tokens": sum(x.num_accepted_tokens for x in m),
                            "acceptance_length": round(emitted / rounds, 4) if rounds else None}}


def _chat_logprobs(tokenizer, choice) -> dict | None:
    if choice.logprobs is None:
        return None
    content = []
    for tok, lp in zip(choice.token_ids, choice.logprobs):
        top = [{"token": tokenizer.decode([t]), "logprob": v} for t, v in lp.items() if t != tok]
        content.append({"token": tokenizer.decode([tok]), "logprob": lp[tok], "top_logprobs": top})
    return {"content": content}


class OpenAIServer:
    def __init__(self, router: AsyncRouter, tokenizer, model_name: str, api_key: str | None = None,
                 default_max_tokens: int = 256):
        self.router, self.tokenizer, self.model_name = router, tokenizer, model_name
        self.api_key, self.default_max_tokens = api_key, default_max_tokens
        self.metrics = ServingMetrics(router)
        self.app = self._build()

    # -- plumbing ---------------------------------------------------------------------------
    def _build(self) -> FastAPI:
        app = FastAPI(title="specray", description="OpenAI-compatible API with lossless speculative decoding")

        @app.middleware("http")
        async def guard(request: Request, call_next):
            if self.api_key and request.url.path.startswith("/v1/"):
                if not authorized(request.headers.get("authorization"), self.api_key):
                    return self._error(ApiError.of(errors.UNAUTHENTICATED, "missing or wrong API key"))
            return await call_next(request)

        @app.exception_handler(ApiError)
        async def api_error(_, exc: ApiError):
            return self._error(exc)

        @app.exception_handler(RequestValidationError)
        async def invalid(_, exc: RequestValidationError):
            first = exc.errors()[0] if exc.errors() else {}
            where = ".".join(str(x) for x in first.get("loc", ())[1:])
            return self._error(ApiError(400, f"{where}: {first.get('msg', 'invalid request')}", param=where or None))

        app.get("/health")(lambda: {"status": "ok"})
        app.get("/metrics")(lambda: Response(self.metrics.exposition(), media_type="text/plain; version=0.0.4"))
        app.get("/v1/models")(self.models)
        app.post("/v1/completions")(self.completions)
        app.post("/v1/chat/completions")(self.chat)
        return app

    def _error(self, exc: ApiError) -> JSONResponse:
        self.metrics.failures.labels(str(exc.status)).inc()
        status = errors.BY_HTTP.get(exc.status)
        headers = {"Retry-After": "1"} if status is not None and status.retryable else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    def _check_model(self, model: str | None) -> None:
        if model not in (None, self.model_name):
            raise ApiError.of(errors.NOT_FOUND, f"model {model!r} does not exist; this server serves "
                              f"{self.model_name!r}", "model")

    async def _run(self, ids: list[int], params, prompt: str | None) -> AsyncIterator[RequestOutput]:
        start, first, last = time.monotonic(), None, None
        try:
            async for out in self.router.generate(ids, params, prompt):
                if first is None and any(c.token_ids for c in out.outputs):
                    first = time.monotonic()
                last = out
                yield out
        except CLIENT_ERRORS as e:
            raise ApiError.of(status_of(e), str(e)) from None
        if last is not None:
            tokens = max(len(c.token_ids) for c in last.outputs)
            self.metrics.observe(start, first, time.monotonic(), tokens, [c.finish_reason for c in last.outputs])

    async def _final(self, request: Request, ids, params, prompt) -> RequestOutput:
        """Run to completion; abort if the client disconnects first."""
        async def drain():
            last = None
            async for out in self._run(ids, params, prompt):
                last = out
            return last

        task = asyncio.ensure_future(drain())
        while not task.done():
            await asyncio.wait([task], timeout=0.5)
            if not task.done() and await request.is_disconnected():
                task.cancel()
                raise ApiError.of(errors.CANCELLED, "client disconnected")
        return task.result()

    # -- routes -----------------------------------------------------------------------------
    async def models(self):
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "specray"}]}

    async def completions(self, body: CompletionRequest, request: Request):
        self._check_model(body.model)
        params = body.sampling_params(self.default_max_tokens, body.logprobs)
        inputs = [(p, self.tokenizer(p).input_ids) if isinstance(p, str) else (None, p) for p in body.prompts()]
        rid, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        if body.stream:
            return self._sse(self._completion_chunks(rid, created, inputs, params, body.n, body.include_usage))
        outs = await asyncio.gather(*(self._final(request, ids, params, text) for text, ids in inputs))
        choices = [{"index": i * body.n + c.index, "text": c.text, "finish_reason": c.finish_reason,
                    "logprobs": None if c.logprobs is None else {
                        "tokens": [self.tokenizer.decode([t]) for t in c.token_ids],
                        "token_logprobs": [lp[t] for lp, t in zip(c.logprobs, c.token_ids)]}}
                   for i, o in enumerate(outs) for c in o.outputs]
        return {"id": rid, "object": "text_completion", "created": created, "model": self.model_name,
                "choices": choices, "usage": _usage(outs)}

    async def chat(self, body: ChatRequest, request: Request):
        self._check_model(body.model)
        if body.max_completion_tokens is not None:
            body.max_tokens = body.max_completion_tokens
        params = body.sampling_params(self.default_max_tokens, body.top_n())
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        ids = chat_token_ids(self.tokenizer, messages)
        rid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        if body.stream:
            return self._sse(self._chat_chunks(rid, created, ids, params, body.include_usage))
        out = await self._final(request, ids, params, None)
        choices = [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                    "finish_reason": c.finish_reason, "logprobs": _chat_logprobs(self.tokenizer, c)}
                   for c in out.outputs]
        return {"id": rid, "object": "chat.completion", "created": created, "model": self.model_name,
                "choices": choices, "usage": _usage([out])}

    # -- streaming --------------------------------------------------------------------------
    def _sse(self, chunks: AsyncIterator[dict]) -> StreamingResponse:
        async def events():
            try:
                async for chunk in chunks:
                    yield f"data: {json.dumps(chunk)}\n\n"
            except ApiError as e:  # errors after the headers went out travel in the stream
                yield f"data: {json.dumps(e.body())}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def _completion_chunks(self, rid, created, inputs, params, n, include_usage):
        finals = []
        for i, (text, ids) in enumerate(inputs):  # prompts stream one after another
            sent: dict[int, int] = {}
            async for out in self._run(ids, params, text):
                if out.finished:
                    finals.append(out)
                for c in out.outputs:
                    delta = c.text[sent.get(c.index, 0):]
                    if delta or c.finish_reason:
                        sent[c.index] = len(c.text)
                        yield {"id": rid, "object": "text_completion", "created": created, "model": self.model_name,
                               "choices": [{"index": i * n + c.index, "text": delta, "logprobs": None,
                                            "finish_reason": c.finish_reason}]}
        if include_usage and finals:
            yield {"id": rid, "object": "text_completion", "created": created, "model": self.model_name,
                   "choices": [], "usage": _usage(finals)}

    async def _chat_chunks(self, rid, created, ids, params, include_usage):
        head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": self.model_name}
        for j in range(params.n):
            yield {**head, "choices": [{"index": j, "delta": {"role": "assistant", "content": ""},
                                        "finish_reason": None}]}
        sent: dict[int, int] = {}
        last = None
        async for out in self._run(ids, params, None):
            last = out
            for c in out.outputs:
                delta = c.text[sent.get(c.index, 0):]
                if delta or c.finish_reason:
                    sent[c.index] = len(c.text)
                    yield {**head, "choices": [{"index": c.index, "delta": {"content": delta} if delta else {},
                                                "finish_reason": c.finish_reason}]}
        if include_usage and last is not None:
            yield {**head, "choices": [], "usage": _usage([last])}
