"""Translation between the `specray.v1` wire messages and the router's types (SamplingParams,
RequestOutput). Bad input raises GrpcAbort(INVALID_ARGUMENT) with the same rules as the HTTP API."""

from __future__ import annotations

import grpc

from specray.cluster.outputs import CompletionOutput, RequestOutput, SpecMetrics, most_likely
from specray.cluster.params import SamplingParams
from specray.cluster.serve.deltas import ChoiceDeltas
from specray.cluster.serve.openai_logprobs import pieces
from specray.cluster.serve.prompts import CHAT_ROLES, PromptEncoder
from specray.protos.specray.v1 import generate_pb2 as pb

FINISH = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH, "abort": pb.FINISH_REASON_ABORT}


class GrpcAbort(Exception):
    """Ends an rpc with `code` and `details`. Picklable (Ray Serve ships it to its proxy)."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(code, details)
        self.code, self.details = code, details

    def __str__(self) -> str:
        return f"{self.code.name}: {self.details}"


class Malformed:
    """Request bytes that do not parse as the rpc's message (cluster/serve/grpc_server.py)."""

    def __init__(self, message_type: str, error: str):
        self.message_type, self.error = message_type, error

    def abort(self) -> GrpcAbort:
        return invalid(f"the request is not a valid {self.message_type} message ({self.error})")


def invalid(details: str) -> GrpcAbort:
    return GrpcAbort(grpc.StatusCode.INVALID_ARGUMENT, details)


# -- requests -------------------------------------------------------------------------------
def sampling_params(sp: pb.SamplingParams, default_max_tokens: int, cache_salt: str | None = None,
                    defaults: dict | None = None) -> SamplingParams:
    """SamplingParams from the wire (and the request's cache salt); unset optionals take the model's
    `defaults` (generation_config), else the documented ones."""
    defaults = defaults or {}

    def opt(name, default):
        return getattr(sp, name) if sp.HasField(name) else defaults.get(name, default)

    try:
        return SamplingParams(
            n=opt("n", 1), temperature=opt("temperature", 1.0), top_p=opt("top_p", 1.0), top_k=opt("top_k", 0),
            seed=opt("seed", None), max_tokens=opt("max_tokens", default_max_tokens), stop=list(sp.stop),
            stop_token_ids=list(sp.stop_token_ids), ignore_eos=sp.ignore_eos, logprobs=opt("logprobs", None),
            num_speculative_tokens=opt("num_speculative_tokens", None), verify_budget=opt("verify_budget", None),
            prompt_logprobs=opt("prompt_logprobs", None), min_p=opt("min_p", 0.0), logit_bias=dict(sp.logit_bias) or None,
            presence_penalty=sp.presence_penalty, frequency_penalty=sp.frequency_penalty,
            repetition_penalty=opt("repetition_penalty", 1.0), min_tokens=sp.min_tokens,
            allowed_token_ids=list(sp.allowed_token_ids) or None, bad_words=list(sp.bad_words) or None,
            truncate_prompt_tokens=opt("truncate_prompt_tokens", None),
            include_stop_str_in_output=sp.include_stop_str_in_output,
            skip_special_tokens=opt("skip_special_tokens", True), cache_salt=cache_salt)
    except ValueError as e:
        raise invalid(str(e)) from None


def chat_messages(chat: pb.ChatMessages) -> list[dict[str, str]]:
    if not chat.messages:
        raise invalid("chat.messages is empty: give at least one message")
    for i, m in enumerate(chat.messages):
        if m.role not in CHAT_ROLES:
            raise invalid(f"chat.messages[{i}].role must be one of {list(CHAT_ROLES)}, got {m.role!r}")
    return [{"role": m.role, "content": m.content, **({"name": m.name} if m.HasField("name") else {})}
            for m in chat.messages]


async def prompt_input(prompts: PromptEncoder, request: pb.GenerateRequest,
                       truncate: int | None = None) -> tuple[str | None, list[int]]:
    """(prompt text or None, prompt token ids) of a request; tokenised off the event loop (`truncate`:
    its truncate_prompt_tokens, which lifts the text's bound by the context)."""
    which = request.WhichOneof("prompt")
    if which is None:
        raise invalid("no prompt: set one of text, token_ids or chat")
    if which == "text":
        return request.text, await prompts.text(request.text, "text", truncate)
    if which == "token_ids":
        return None, list(request.token_ids.ids)
    go_on = request.chat.continue_final_message
    opening = request.chat.add_generation_prompt if request.chat.HasField("add_generation_prompt") else not go_on
    if go_on and opening:  # as the HTTP API (and vLLM)
        raise invalid("chat.continue_final_message continues the last message, add_generation_prompt opens a new "
                      "one: set add_generation_prompt to false")
    return None, await prompts.chat(chat_messages(request.chat), "chat.messages", truncate,
                                    add_generation_prompt=opening, continue_final_message=go_on)


# -- outputs --------------------------------------------------------------------------------
def token_logprobs(tokenizer, token_ids: list[int], logprobs: list[dict[int, float]] | None,
                   n: int | None, start: int = 0, prompt_ids=None, skip: bool = True) -> list[pb.TokenLogprob]:
    """Tokens [start:] of a choice (`logprobs` holds positions start onwards): each one's logprob
    and the `n` most likely tokens at its position (the drawn one among them where it ranks there).
    Token texts are decoded in context, as the HTTP API's, so they add up to the choice's text (a
    token alone loses a leading space or a multi-byte character's other bytes; `prompt_ids`: the
    first token's read after the prompt, as the choice's text)."""
    if not logprobs:
        return []
    out = []
    for i, lp in enumerate(logprobs, start):
        tok, top = token_ids[i], most_likely(lp, n or 0)
        texts = pieces(tokenizer, token_ids, i, [tok] + [t for t, _ in top], skip, prompt_ids)
        out.append(pb.TokenLogprob(token_id=tok, token=texts[0], logprob=lp[tok], rank=getattr(lp, "rank", None),
                                   top=[pb.TopLogprob(token_id=t, token=x, logprob=v)
                                        for x, (t, v) in zip(texts[1:], top)]))
    return out


def choice_finish(c: CompletionOutput) -> pb.ChoiceFinish:
    msg = pb.ChoiceFinish(index=c.index, finish_reason=FINISH.get(c.finish_reason, pb.FINISH_REASON_UNSPECIFIED))
    if isinstance(c.stop_reason, str):
        msg.stop_string = c.stop_reason
    elif isinstance(c.stop_reason, int):
        msg.stop_token_id = c.stop_reason
    return msg


def usage(out: RequestOutput) -> pb.Usage:
    prompt, completion = len(out.prompt_token_ids), sum(len(c.token_ids) for c in out.outputs)
    return pb.Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                    cached_tokens=out.num_cached_tokens)


def speculative(m: SpecMetrics) -> pb.SpeculativeMetrics:
    return pb.SpeculativeMetrics(num_rounds=m.num_rounds, num_draft_tokens=m.num_draft_tokens,
                                 num_accepted_tokens=m.num_accepted_tokens, num_emitted_tokens=m.num_emitted_tokens,
                                 acceptance_length=m.acceptance_length, acceptance_rate=m.acceptance_rate)


def prompt_logprobs(tokenizer, out: RequestOutput, params: SamplingParams) -> list[pb.TokenLogprob]:
    """The prompt's tokens from the second, each one's logprob and the prompt_logprobs most likely there."""
    if out.prompt_logprobs is None:
        return []
    return token_logprobs(tokenizer, out.prompt_token_ids, out.prompt_logprobs[1:], params.prompt_logprobs, start=1,
                          skip=params.skip_special_tokens)


def complete_response(tokenizer, request_id: str, model: str, out: RequestOutput,
                      params: SamplingParams) -> pb.CompleteResponse:
    choices = [pb.Choice(index=c.index, text=c.text, token_ids=c.token_ids, finish=choice_finish(c),
                         logprobs=token_logprobs(tokenizer, c.token_ids, c.logprobs, params.logprobs,
                                                 prompt_ids=out.prompt_token_ids, skip=params.skip_special_tokens))
               for c in out.outputs]
    return pb.CompleteResponse(request_id=request_id, model=model, choices=choices, usage=usage(out),
                               speculative=speculative(out.metrics),
                               prompt_logprobs=prompt_logprobs(tokenizer, out, params))


def summary(tokenizer, request_id: str, model: str, out: RequestOutput, params: SamplingParams) -> pb.GenerateResponse:
    return pb.GenerateResponse(request_id=request_id, summary=pb.GenerateSummary(
        choices=[choice_finish(c) for c in out.outputs], usage=usage(out), speculative=speculative(out.metrics),
        model=model, prompt_logprobs=prompt_logprobs(tokenizer, out, params)))


class DeltaTracker:
    """Turns successive RequestOutputs of one request into per-choice deltas."""

    def __init__(self, tokenizer, request_id: str, top_n: int | None, skip: bool = True):
        """`skip`: the request's skip_special_tokens, for the logprobs' token texts."""
        self.tokenizer, self.request_id, self.top_n, self.skip = tokenizer, request_id, top_n, skip
        self.choices = ChoiceDeltas()

    def deltas(self, out: RequestOutput) -> list[pb.GenerateResponse]:
        msgs = []
        for c in out.outputs:
            if (new := self.choices.take(c, tokens_alone=True)) is None:
                continue
            text, k0 = new
            tokens = c.token_ids[k0:]
            lps = token_logprobs(self.tokenizer, c.token_ids, c.logprobs[k0:] if c.logprobs else None, self.top_n,
                                 start=k0, prompt_ids=out.prompt_token_ids, skip=self.skip)
            msgs.append(pb.GenerateResponse(request_id=self.request_id, delta=pb.ChoiceDelta(
                index=c.index, text=text, token_ids=tokens, logprobs=lps,
                finish_reason=FINISH.get(c.finish_reason, pb.FINISH_REASON_UNSPECIFIED))))
        return msgs
