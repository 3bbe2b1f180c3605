"""The offline Python API, shaped like vLLM's: `LLM(...).generate(prompts, params)`."""

from __future__ import annotations

import inspect
from dataclasses import replace
from collections.abc import Sequence as Seq
from typing import Any

import torch

from specray.actors.diffusion_worker import DiffusionWorker
from specray.actors.draft_worker import DraftWorker
from specray.actors.target_worker import TargetWorker
from specray.cluster.config.defaults import resolve_prefill_tokens
from specray.cluster.config.diffusion import decode_options
from specray.cluster.config.speculative import SpeculativeConfig
from specray.cluster.config.worker_specs import draft_spec, num_blocks
from specray.cluster.generation_defaults import sampling_defaults
from specray.cluster.llm_inputs import (OneThread, PromptLike, as_list, check_conversation, check_engine_args,
                                         check_int_arg, check_prompt_keys, dict_token_ids, dtype_name, is_token_id,
                                         params_list, parse_dtype, token_ids)
from specray.cluster.outputs import CompletionOutput, Logprob, PublicLogprobs, RequestOutput
from specray.cluster.params import MAX_API_SEED, MIN_SEED, SamplingParams
from specray.cluster.pools.in_process import InProcessDiffusionPool, InProcessDraftPool, InProcessTargetPool
from specray.cluster.router.diffusion_router import DiffusionRouter, diffusion_limits
from specray.cluster.router.limits import router_limits
from specray.cluster.router.router import Router
from specray.cluster.serve.prompts import check_text
from specray.kernels.chat import chat_token_ids
from specray.kernels.drafters.loading import check_draft, refuse_partial_draft
from specray.kernels.drafters.registry import build_drafter
from specray.kernels.diffusion.config import is_diffusion_folder
from specray.kernels.diffusion.weights import load_diffusion_model, read_config
from specray.kernels.kernel_modes import FAST_PARTS
from specray.kernels.loader import load_model, resolve

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob"]


class LLM:
    """An in-process specray engine: target and draft workers run in this process."""

    def __init__(self, model: str = "smollm2-135m", speculative_config: dict[str, Any] | None = None,
                 dtype: str | torch.dtype = "float32", device: str = "cpu", max_model_len: int | None = None,
                 max_num_seqs: int = 32, kv_cache_tokens: int = 16384, block_size: int = 16, seed: int | None = 0,
                 pipelined: bool = False, tokenizer: str | None = None, skip_tokenizer_init: bool = False,
                 diffusion_config: dict[str, Any] | None = None, kernels: str = "auto",
                 max_prefill_tokens: int | str | None = "auto", enable_prefix_caching: bool = True,
                 generation_config: str = "auto"):
        """`tokenizer`: a folder or alias to take the tokenizer from (default: the model's own);
        `skip_tokenizer_init`: none at all, prompts and outputs are token ids (texts stay empty).
        A diffusion LM (a LLaDA or Dream folder) is detected from its config: `speculative_config`
        then takes FreeDave ({"method": "freedave", "num_drafts": K}) and `diffusion_config` its
        block_length and steps_per_block (cluster/config/diffusion.py). `kernels`: the target's CPU
        kernels on GGUF weights: "exact" (the fp32 model, what transformers computes), "fast16" (integer
        dot products on 16-bit activations in two 8-bit parts) or "fast" (8-bit activations; both fast
        modes keep a 16-bit KV cache: kernels/fast_linear.py); "auto": fast16 where the weights are GGUF
        Q4_1/Q8_0 blocks on a CPU in fp32, exact otherwise (`kernels.loader.load_model`), as `specray serve` does. `max_prefill_tokens`: prompt tokens a round prefills at most, a longer prompt in
        chunks over several rounds ("auto": 256 on CPU, 64 of them while other sequences decode, 512 on
        an accelerator; None: every prompt that fits, whole), as `specray serve` does.
        `enable_prefix_caching`: a prompt's full KV blocks that an earlier request computed are taken,
        not computed again (outputs unchanged; docs/serving.md); an autoregressive target's only.
        `generation_config`: where unset options' defaults come from, as vLLM's (cluster/generation_defaults.py)."""
        for name, flag in (("enable_prefix_caching", enable_prefix_caching), ("pipelined", pipelined),
                           ("skip_tokenizer_init", skip_tokenizer_init)):
            if type(flag) is not bool:  # "no" is truthy
                raise ValueError(f"{name} must be True or False, got {flag!r}")
        torch_dtype = parse_dtype(dtype)
        check_engine_args(device, kv_cache_tokens, block_size, max_num_seqs, kernels, torch_dtype)
        check_int_arg("seed", seed, MIN_SEED, optional=True)
        if seed is not None and seed > MAX_API_SEED:
            raise ValueError(f"seed must be an integer in [{MIN_SEED}, {MAX_API_SEED}] or None, got {seed!r}")
        check_int_arg("max_model_len", max_model_len, 2, optional=True)  # a prompt token and one to generate
        prefill_tokens = resolve_prefill_tokens(max_prefill_tokens, device)  # checked before the weights load
        # open streams' requests, and the latest output of each that another call's rounds produced
        self._streamed: set[str] = set()
        self._held: dict[str, RequestOutput] = {}
        self._one_thread = OneThread()
        if seed is not None:  # None: unseeded requests draw differently every run
            torch.manual_seed(seed)
        checkpoint = resolve(model)
        refuse_partial_draft(checkpoint.path, model)
        self.model_name = model
        self.tokenizer = None if skip_tokenizer_init else resolve(tokenizer).tokenizer() if tokenizer \
            else checkpoint.tokenizer()
        self._logprobs = PublicLogprobs(self.tokenizer)
        diffusion = is_diffusion_folder(checkpoint.path)  # a diffusion LM takes no generation_config defaults
        self.sampling_defaults = sampling_defaults(generation_config, checkpoint.path, diffusion)
        if diffusion:
            if kernels in FAST_PARTS:
                raise ValueError(f"kernels={kernels!r} applies to autoregressive GGUF models; {model!r} is a "
                                 "diffusion LM")
            set_ = [name for name, value in (("pipelined", pipelined), ("kv_cache_tokens", kv_cache_tokens),
                                             ("block_size", block_size), ("max_prefill_tokens", max_prefill_tokens))
                    if value != _DEFAULTS[name]]
            if set_:  # a diffusion LM has no KV cache, draft pool or prefill chunks: they were ignored
                raise ValueError(f"{', '.join(set_)} apply to autoregressive models; {model!r} is a diffusion LM")
            self.router = diffusion_router(checkpoint, self.tokenizer, speculative_config, diffusion_config,
                                           torch_dtype, device, max_model_len, max_num_seqs)
            self.target, self.draft = self.router.target.worker, None
            return
        if diffusion_config:
            raise ValueError(f"diffusion_config applies to diffusion LMs; {model!r} is autoregressive")
        spec = SpeculativeConfig.from_dict(speculative_config)
        check_draft(checkpoint.path, spec)  # a draft that is not there or does not fit fails before the target loads
        target_model = load_model(checkpoint, torch_dtype, device, kernels=kernels)
        blocks = num_blocks(kv_cache_tokens, block_size)
        self.target = TargetWorker(target_model, blocks, block_size,
                                   cost_key=(str(checkpoint.path), target_model.kernel_mode, dtype_name(torch_dtype), device, 1),
                                   prefix_caching=enable_prefix_caching)
        draft = draft_spec(spec, model, dtype_name(torch_dtype), device, kv_cache_tokens, block_size,
                           max_num_seqs=max_num_seqs)
        self.draft = None if draft is None else DraftWorker(build_drafter(draft))
        config, eos = router_limits(target_model.config, self.tokenizer, spec, max_model_len, max_num_seqs,
                                    blocks, block_size, pipelined, prefill_tokens,
                                    enable_prefix_caching)
        draft_pool = None if self.draft is None else InProcessDraftPool(self.draft)
        self.router = Router(InProcessTargetPool(self.target), draft_pool, self.tokenizer, eos, config)

    def get_tokenizer(self):
        return self.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """What `sampling_params=None` means: SamplingParams() with the model's generation_config defaults."""
        return SamplingParams(**self.sampling_defaults)

    def _params(self, sampling_params, n: int) -> list[SamplingParams]:
        return params_list(self.get_default_sampling_params() if sampling_params is None else sampling_params, n)

    def encode(self, prompt: PromptLike) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this LLM has no tokenizer (skip_tokenizer_init=True): give token ids")
            check_text(prompt, "text")
            return prompt, self.tokenizer(prompt).input_ids
        if isinstance(prompt, dict):
            return self._encode_dict(prompt)
        if isinstance(prompt, list) and all(is_token_id(t) for t in prompt):
            return None, token_ids(prompt)
        raise ValueError(f"a prompt must be a string, a list of token ids or a dict, got {type(prompt).__name__}")

    def _encode_dict(self, prompt: dict) -> tuple[str | None, list[int]]:
        """vLLM's TextPrompt or TokensPrompt (its cache_salt: `_encode_all`)."""
        check_prompt_keys(prompt)
        if "prompt_token_ids" in prompt:
            return prompt.get("prompt"), dict_token_ids(prompt["prompt_token_ids"])
        if "prompt" in prompt:
            return self.encode(prompt["prompt"])
        raise ValueError("a prompt dict needs 'prompt' (text) or 'prompt_token_ids'")

    def generate(self, prompts: PromptLike | Seq[PromptLike],
                 sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order.

        Every prompt is validated before any runs: a bad one raises ValueError naming its index.
        """
        prompts = as_list(prompts)
        with self._one_thread.held():
            ids = self._add_all(prompts, self._params(sampling_params, len(prompts)))
            return self._run(ids, use_tqdm)

    def stream(self, prompts: PromptLike | Seq[PromptLike], sampling_params: SamplingParams | None = None):
        """Yield every `RequestOutput` as its request advances (one per request per round). Bad prompts
        or parameters raise here, at the call; the requests start at the first `next()`."""
        prompts = as_list(prompts)
        params = self._params(sampling_params, len(prompts))
        return self._stream(self._encode_all(prompts, params), params)

    def _stream(self, encoded: list[tuple[str | None, list[int]]], params: list[SamplingParams]):
        with self._one_thread.held():  # from the first next() until the stream ends or is closed
            yield from self._stream_held(encoded, params)

    def _stream_held(self, encoded: list[tuple[str | None, list[int]]], params: list[SamplingParams]):
        ids = self._add_encoded(encoded, params)
        own, finished = set(ids), set()
        self._streamed |= own
        try:
            while len(finished) < len(own):
                held = [self._held.pop(i) for i in ids if i in self._held]  # another call's rounds ran them
                if not held and not self.router.has_unfinished():
                    break
                for out in held or self._own_outputs(self.router.step(), own):
                    if out.finished:
                        finished.add(out.request_id)
                    yield self._logprobs(out)
                self._raise_failures(ids)
        finally:  # a loop left early (break, an exception) ends its requests: none runs on unread
            self._streamed -= own
            for i in ids:
                self._held.pop(i, None)
                self._logprobs.forget(i)
            self._abort(ids)

    def _own_outputs(self, outs: list[RequestOutput], own: set[str]) -> list[RequestOutput]:
        """A round's outputs of `own` requests; another open stream's are held for it (the newest:
        outputs are cumulative), none is lost."""
        for out in outs:
            if out.request_id not in own and out.request_id in self._streamed:
                self._held[out.request_id] = out
        return [out for out in outs if out.request_id in own]

    def _abort(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.router.abort(request_id)

    def _raise_failures(self, request_ids: list[str]) -> None:
        """A request that failed inside a worker ends the call with the worker's own error (this
        process is the operator's), after aborting the call's other requests."""
        failures = self.router.take_failures()
        if failures:
            self._abort(request_ids)
            request_id, failure = failures[0]
            raise failure.__cause__ or failure

    def _add_all(self, prompts: Seq[PromptLike], params: list[SamplingParams]) -> list[str]:
        return self._add_encoded(self._encode_all(prompts, params), params, checked=True)

    def _encode_all(self, prompts: Seq[PromptLike], params: list[SamplingParams]) -> list[tuple[str | None, list[int]]]:
        """(text, token ids) of every prompt, each checked against its parameters: all or none are added.
        A prompt dict's cache_salt goes into its parameters (`params[i]` becomes a copy)."""
        encoded = []
        for i, prompt in enumerate(prompts):
            try:
                if isinstance(prompt, dict) and prompt.get("cache_salt") is not None:
                    params[i] = replace(params[i], cache_salt=prompt["cache_salt"])
                encoded.append(self.encode(prompt))
                self.router.check_prompt(encoded[-1][1], params[i])
            except ValueError as e:
                raise ValueError(f"prompt {i}: {e}") from None
        return encoded

    def _add_encoded(self, encoded: list[tuple[str | None, list[int]]], params: list[SamplingParams],
                     checked: bool = False) -> list[str]:
        """`checked`: `_encode_all` checked them just now, in this call (a stream adds its requests at
        its first next(), after any change the caller made to the parameters: checked again)."""
        ids = [self.router.add_request(tok, sp, text, checked=checked) for (text, tok), sp in zip(encoded, params)]
        for request_id, sp in zip(ids, params):
            self._logprobs.track(request_id, sp.logprobs, sp.prompt_logprobs)
        return ids

    def chat(self, messages: list[dict[str, str]] | list[list[dict[str, str]]],
             sampling_params: SamplingParams | None = None, use_tqdm: bool = False,
             add_generation_prompt: bool = True, continue_final_message: bool = False) -> list[RequestOutput]:
        """Apply the tokenizer's chat template, then generate. As vLLM's: `add_generation_prompt` opens
        the assistant's turn; `continue_final_message` (with it false) continues the last message."""
        if isinstance(messages, dict):
            raise ValueError("messages must be a list of {'role', 'content'} dicts (one conversation) or a list of "
                             "conversations; got one message alone: put it in a list")
        if not messages:
            raise ValueError("messages is empty: a conversation needs at least one message")
        conversations = [messages] if isinstance(messages[0], dict) else messages
        for i, conversation in enumerate(conversations):
            check_conversation(conversation, i)
        ids = [self.apply_chat_template(c, add_generation_prompt, continue_final_message) for c in conversations]
        # the rendered conversation as the output's prompt, as vLLM reports it
        prompts = [{"prompt_token_ids": t, "prompt": self.tokenizer.decode(t)} for t in ids]
        return self.generate(prompts, sampling_params, use_tqdm)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True,
                            continue_final_message: bool = False) -> list[int]:
        check_conversation(messages, 0)
        if self.tokenizer is None:
            raise ValueError("this LLM has no tokenizer (skip_tokenizer_init=True): a chat template needs one; "
                             "give token ids to generate")
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"model {self.model_name!r} has no chat template")
        return chat_token_ids(self.tokenizer, messages, add_generation_prompt, continue_final_message)

    def _run(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        from tqdm import tqdm

        done: dict[str, RequestOutput] = {}
        wanted = set(request_ids)
        bar = tqdm(total=len(request_ids), desc="generate", disable=not use_tqdm)
        try:  # until its own requests end (a stream still held elsewhere keeps its own running)
            while len(done) < len(request_ids) and self.router.has_unfinished():
                for out in self._own_outputs(self.router.step(), wanted):
                    if out.finished:
                        done[out.request_id] = self._logprobs(out)
                        bar.update(1)
                self._raise_failures(request_ids)
        finally:  # interrupted (Ctrl-C): its requests end with it
            for request_id in request_ids:
                self._logprobs.forget(request_id)
            self._abort(request_ids)
            bar.close()
        return [done[i] for i in request_ids if i in done]


_DEFAULTS = {name: p.default for name, p in inspect.signature(LLM.__init__).parameters.items()}


def diffusion_router(checkpoint, tokenizer, speculative_config, diffusion_config, dtype, device: str,
                     max_model_len: int | None, max_num_seqs: int) -> DiffusionRouter:
    """A DiffusionRouter over an in-process DiffusionWorker of `checkpoint` (the offline API's engine)."""
    options = decode_options(speculative_config, diffusion_config)
    config = read_config(checkpoint.path)
    limits = diffusion_limits(config, options.block_length, max_model_len, max_num_seqs)  # before the weights load
    model = load_diffusion_model(checkpoint.path, dtype, device)
    eos = set(config.model.eos_token_ids) or ({tokenizer.eos_token_id} if tokenizer is not None else set())
    return DiffusionRouter(InProcessDiffusionPool(DiffusionWorker(model, options)), tokenizer, eos, limits)
