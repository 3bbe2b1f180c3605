"""OpenAI-compatible HTTP API (FastAPI) over an AsyncRouter: /v1/completions, /v1/chat/completions
(SSE streaming or not), /v1/models, /health, /metrics. A plain class: Ray Serve wraps it in the
builder module, `uvicorn` can serve it directly.

Every error, FastAPI's own included, answers with the OpenAI error body; a request that fails
inside the engine answers 500 with a reference into the server log, never the engine's internals.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from specray.cluster.outputs import RequestOutput
from specray.cluster.router.async_router import AsyncRouter
from specray.cluster.router.failures import request_failed
from specray.cluster.serve import errors
from specray.cluster.serve.auth import authorized
from specray.cluster.config.defaults import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_REQUEST_BYTES
from specray.cluster.serve.middleware import CallLimit, KeyGuard, RequestLimits
from specray.cluster.serve.errors import REQUEST_ERRORS, status_of
from specray.cluster.serve.http_server import MAX_HEADER_BYTES
from specray.cluster.serve.metrics import ServingMetrics
from specray.cluster.serve.openai_chunks import chat_choices, chat_chunks, completion_chunks, usage_body
from specray.cluster.serve.openai_completions import Echo, completion_choice, prompt_only, prompts_only
from specray.cluster.serve.openai_protocol import ApiError, ChatRequest, CompletionRequest, validation_error
from specray.cluster.serve.prompts import PromptEncoder, PromptError

OPEN_PATHS = ("/health", "/metrics")  # everything else needs the key when one is set (/docs too)
DISCONNECT_POLL_S = 0.5


class OpenAIServer:
    def __init__(self, router: AsyncRouter, tokenizer, model_name: str, api_key: str | None = None,
                 default_max_tokens: int = 256, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 max_calls: int | None = None, body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
                 sampling_defaults: dict | None = None):
        """`max_calls`: calls in flight at most (health checks and metrics aside); more get 503.
        `body_timeout_s`: a request body must arrive whole within it (408). `sampling_defaults`:
        the model's, for options a request leaves unset (cluster/generation_defaults.py)."""
        self.router, self.tokenizer, self.model_name = router, tokenizer, model_name
        self.api_key, self.default_max_tokens, self.sampling_defaults = api_key, default_max_tokens, sampling_defaults or {}
        self.metrics = ServingMetrics(router)
        self.prompts = PromptEncoder.for_limits(tokenizer, router.router.config)
        self.created = int(time.time())  # the model card's: when this server started
        self.app = self._build(max_request_bytes, max_calls, body_timeout_s)

    # -- plumbing ---------------------------------------------------------------------------
    def _build(self, max_request_bytes: int, max_calls: int | None, body_timeout_s: float) -> FastAPI:
        app = FastAPI(title="specray", description="OpenAI-compatible API with lossless speculative decoding")

        # Plain ASGI middlewares: Starlette's BaseHTTPMiddleware would hide a client's disconnect
        app.add_middleware(RequestLimits, max_bytes=max_request_bytes,
                           reject=lambda message: self._error(ApiError.of(errors.TOO_LARGE, message)),
                           max_header_bytes=MAX_HEADER_BYTES, body_timeout_s=body_timeout_s,
                           reject_headers=lambda message: self._error(ApiError.of(errors.HEADERS_TOO_LARGE, message)))
        app.add_middleware(KeyGuard, allowed=self._allowed,
                           reject=lambda: self._error(ApiError.of(errors.UNAUTHENTICATED, "missing or wrong API key")))
        if max_calls is not None:  # outermost: a refused call costs no parsing
            app.add_middleware(CallLimit, max_calls=max_calls, exempt=OPEN_PATHS, reject=lambda: self._error(
                ApiError.of(errors.UNAVAILABLE, f"the server is at its {max_calls} calls in flight; retry")))
        app.exception_handler(ApiError)(lambda _, exc: self._error(exc))
        app.exception_handler(RequestValidationError)(lambda _, exc: self._error(validation_error(exc)))
        app.exception_handler(HTTPException)(lambda _, exc: self._error(self._http_error(exc)))
        app.exception_handler(Exception)(lambda _, exc: self._error(self._internal(exc)))
        app.get("/health")(self.health)
        app.head("/health", include_in_schema=False)(self.health)  # load balancers probe with either
        app.get("/metrics")(self.prometheus)
        app.get("/v1/models")(self.models)
        app.get("/v1/models/{model:path}")(self.model)
        app.post("/v1/completions")(self._counted(self.completions))
        app.post("/v1/chat/completions")(self._counted(self.chat))
        return app

    def health(self):
        """200 while the engine serves; 503 once it stopped (the replica then restarts)."""
        if self.router.alive:
            return {"status": "ok"}
        return JSONResponse({"status": "unavailable", "reason": "the engine stopped"}, status_code=503)

    def prometheus(self):
        """The serving metrics in Prometheus' text format."""
        return Response(self.metrics.exposition(), media_type="text/plain; version=0.0.4")

    def _counted(self, handler):
        """`handler`, counting a call cancelled before its response (Ray Serve's proxy cancels the
        handler of a client that hung up; the replica's own server polls and answers 499)."""
        @functools.wraps(handler)
        async def counted(*args, **kwargs):
            try:
                return await handler(*args, **kwargs)
            except asyncio.CancelledError:
                self.metrics.failed(errors.CANCELLED.http)
                raise
        return counted

    def _allowed(self, path: str, authorization: bytes | None) -> bool:
        return not self.api_key or path in OPEN_PATHS or authorized(authorization, self.api_key)

    def _error(self, exc: ApiError) -> JSONResponse:
        self.metrics.failed(exc.status)
        status = errors.BY_HTTP.get(exc.status)
        headers = {"Retry-After": "1"} if status is not None and status.retryable else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @staticmethod
    def _http_error(exc: HTTPException) -> ApiError:
        """FastAPI's own errors (404, 405, unparsable bodies) in the OpenAI body."""
        status = errors.BY_HTTP.get(exc.status_code, errors.INVALID)
        detail = str(exc.detail)
        if detail == "There was an error parsing the body":  # FastAPI: bytes that are not UTF-8 JSON
            detail = "request body is not valid JSON in UTF-8"
        return ApiError(exc.status_code, detail, status.openai_type)

    @staticmethod
    def _internal(exc: Exception) -> ApiError:
        return ApiError.of(errors.INTERNAL, str(request_failed("http", exc)))

    def _check_model(self, model: str | None) -> None:
        if model not in (None, self.model_name):
            raise ApiError.of(errors.NOT_FOUND, f"model {model!r} does not exist; this server serves "
                              f"{self.model_name!r}", "model")

    async def _encode(self, prompt: str | list[int], param: str, max_tokens: int | None,
                      truncate: int | None) -> tuple[str | None, list[int]]:
        """The prompt's token ids; an explicit max_tokens must fit beside them (beside the tokens
        `truncate`, the request's truncate_prompt_tokens, keeps)."""
        try:
            ids = prompt if not isinstance(prompt, str) else await self.prompts.text(prompt, param, truncate)
            if max_tokens is not None:
                self.prompts.check_room(len(ids), max_tokens, truncate=truncate)
        except PromptError as e:
            raise ApiError(400, str(e), param=e.param) from None
        return (prompt if isinstance(prompt, str) else None), ids

    async def _run(self, ids: list[int], params, prompt: str | None,
                   prompt_param: str = "prompt") -> AsyncIterator[RequestOutput]:
        start, first, last = time.monotonic(), None, None
        try:
            async for out in self.router.generate(ids, params, prompt):
                if first is None and any(c.token_ids for c in out.outputs):
                    first = time.monotonic()
                last = out
                yield out
        except REQUEST_ERRORS as e:  # the router's checks name the field they refuse
            param = getattr(e, "param", None)
            raise ApiError.of(status_of(e), str(e), prompt_param if param == "prompt" else param) from None
        if last is not None:
            tokens = max(len(c.token_ids) for c in last.outputs)
            self.metrics.observe(start, first, time.monotonic(), tokens)

    async def _final(self, request: Request, ids, params, prompt, prompt_param: str = "prompt") -> RequestOutput:
        """Run to completion; a client that hangs up aborts the run (`_while_connected`)."""
        async def drain():
            last = None
            async for out in self._run(ids, params, prompt, prompt_param):
                last = out
            return last

        return await self._while_connected(request, drain())

    @staticmethod
    async def _while_connected(request: Request, work):
        """Await `work` while the client stays: one that hangs up (polled here; Ray Serve cancels
        this coroutine instead) cancels it, which aborts its run and frees its sequences, whether
        it waits in the queue, prefills or decodes."""
        task = asyncio.ensure_future(work)
        try:
            while not task.done():
                await asyncio.wait([task], timeout=DISCONNECT_POLL_S)
                if not task.done() and await request.is_disconnected():
                    raise ApiError.of(errors.CANCELLED, "client disconnected")
            return task.result()
        finally:
            task.cancel()

    @staticmethod
    async def _all(runs) -> list[RequestOutput]:
        """Every prompt's run; the first error cancels (and so aborts) the others."""
        tasks = [asyncio.ensure_future(run) for run in runs]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()

    # -- routes -----------------------------------------------------------------------------
    def _model_card(self) -> dict:
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "specray",
                "max_model_len": self.prompts.max_model_len}

    async def models(self):
        return {"object": "list", "data": [self._model_card()]}

    async def model(self, model: str):
        self._check_model(model)
        return self._model_card()

    async def completions(self, body: CompletionRequest, request: Request):
        self._check_model(body.model)
        scoring = body.prompt_only
        if scoring:  # one token is drawn and dropped
            body.max_tokens = 1
        params = body.sampling_params(self.default_max_tokens, body.logprobs, self.sampling_defaults)
        prompts = body.prompts()
        if len(prompts) > 1:
            try:
                self.router.check_size(len(prompts) * body.n, f"{len(prompts)} prompts x n={body.n}",
                                       "prompt" if body.n == 1 else "n")
            except ValueError as e:
                raise ApiError.of(status_of(e), str(e), getattr(e, "param", "n")) from None
        names = ["prompt"] if len(prompts) == 1 else [f"prompt[{i}]" for i in range(len(prompts))]
        inputs = [(*await self._encode(p, name, body.max_tokens, params.truncate_prompt_tokens), name)
                  for p, name in zip(prompts, names)]
        rid, created = f"cmpl-{body.request_id or uuid.uuid4().hex[:24]}", int(time.time())
        if body.stream:
            run = (lambda *a: prompts_only(self._run(*a))) if scoring else self._run
            chunks = completion_chunks(run, self.tokenizer, self.model_name, rid, created, inputs, params, body.n,
                                       body.include_usage, Echo.of(body, self.tokenizer, params.skip_special_tokens),
                                       self.prompts.render)
            return await self._sse(request, chunks)
        outs = await self._all(self._final(request, ids, params, text, name) for text, ids, name in inputs)
        outs = [prompt_only(o) for o in outs] if scoring else outs

        def render():
            return [completion_choice(self.tokenizer, body, params, i * body.n, o, c)
                    for i, o in enumerate(outs) for c in o.outputs]
        choices = await self.prompts.render(
            render, body.echo or body.logprobs is not None or body.prompt_logprobs is not None)
        self.metrics.succeeded(outs[0].outputs[0].finish_reason)
        return {"id": rid, "object": "text_completion", "created": created, "model": self.model_name,
                "choices": choices, "usage": usage_body(outs)}

    async def chat(self, body: ChatRequest, request: Request):
        self._check_model(body.model)
        if body.max_completion_tokens is not None:
            body.max_tokens = body.max_completion_tokens
        params = body.sampling_params(self.default_max_tokens, body.top_n(), self.sampling_defaults)
        try:
            ids = await self.prompts.chat([m.template_fields(i) for i, m in enumerate(body.messages)],
                                          truncate=params.truncate_prompt_tokens, **body.template_options())
            if body.max_tokens is not None:
                self.prompts.check_room(len(ids), body.max_tokens,
                                        "max_tokens" if body.max_completion_tokens is None else "max_completion_tokens",
                                        params.truncate_prompt_tokens)
        except PromptError as e:
            raise ApiError(400, str(e), param=e.param) from None
        rid, created = f"chatcmpl-{body.request_id or uuid.uuid4().hex[:24]}", int(time.time())
        role, echoed = body.reply_role(), body.echoed()
        if body.stream:
            return await self._sse(request, chat_chunks(self._run, self.tokenizer, self.model_name, rid, created, ids, params,
                                                        body.include_usage, role, echoed))
        out = await self._final(request, ids, params, None, "messages")

        choices, prompt_logprobs = await self.prompts.render(
            lambda: chat_choices(self.tokenizer, out, params, role, echoed, body.prompt_logprobs),
            params.logprobs is not None or body.prompt_logprobs is not None)
        self.metrics.succeeded(out.outputs[0].finish_reason)
        return {"id": rid, "object": "chat.completion", "created": created, "model": self.model_name,
                "choices": choices, "usage": usage_body([out]), **prompt_logprobs}

    # -- streaming --------------------------------------------------------------------------
    async def _sse(self, request: Request, chunks: AsyncIterator[dict]) -> StreamingResponse:
        """The response starts once the first chunk is ready, so a request refused on admission
        (400, 429, 503) or failed before its first token gets a real HTTP status; a client that
        hangs up before it aborts the run as an unstreamed request's does."""
        first = await self._while_connected(request, anext(chunks))

        async def rest():
            yield first
            async for chunk in chunks:
                yield chunk

        async def events():
            reason = None
            try:
                async for chunk in rest():
                    reason = next((c["finish_reason"] for c in chunk["choices"] if c.get("finish_reason")), reason)
                    yield f"data: {json.dumps(chunk)}\n\n"
            except asyncio.CancelledError:  # the client hung up: the run was aborted
                self.metrics.failed(errors.CANCELLED.http)
                raise
            except Exception as e:  # noqa: BLE001 - errors after the headers went out travel in the stream
                error = e if isinstance(e, ApiError) else self._internal(e)
                self.metrics.failed(error.status)
                yield f"data: {json.dumps(error.body())}\n\n"
            else:
                self.metrics.succeeded(reason)
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")
