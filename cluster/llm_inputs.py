"""What the in-process engine (cluster/llm.py) accepts: its engine arguments, prompts as vLLM users
pass them (strings, token ids of any integer type, dicts, lists of those), sampling parameters per
prompt, and chat conversations; a ValueError naming what is wrong, before anything loads or runs."""

from __future__ import annotations

import numbers
import threading
from contextlib import contextmanager
from typing import Any

import torch

from specray.cluster.params import SamplingParams
from specray.cluster.serve.prompts import CHAT_ROLES, check_text
from specray.kernels.kernel_modes import KERNELS_AUTO, check_kernel_setting
from specray.kernels.loader import DTYPES

PromptLike = str | dict[str, Any] | list[int]
PROMPT_KEYS = ("prompt", "prompt_token_ids", "cache_salt")


def check_prompt_keys(prompt: dict) -> None:
    """Keys of a prompt dict specray would ignore (multi_modal_data, prompt_embeds, ...), refused by name."""
    unknown = sorted(set(prompt) - set(PROMPT_KEYS))
    if unknown:
        raise ValueError(f"prompt keys {unknown} are not supported; a prompt dict takes 'prompt' (text) or "
                         "'prompt_token_ids', and 'cache_salt'")


def dict_token_ids(ids) -> list[int]:
    """A prompt dict's prompt_token_ids: a list, tuple, or a 1-D NumPy array or tensor of token ids."""
    if not (isinstance(ids, (list, tuple)) or getattr(ids, "ndim", None) == 1):
        raise ValueError(f"prompt_token_ids must be a list of token ids, got {type(ids).__name__}")
    return token_ids(ids)


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A dtype's name or itself; "auto" (vLLM's default) is specray's own default, float32: the CPU
    kernels read fp32 weights (and round them to their block formats)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)} or 'auto'")
    return DTYPES[dtype]


def parse_device(device: str) -> torch.device:
    """cpu, cuda or cuda:N as a torch.device (whether this machine has it is the caller's question);
    ValueError otherwise."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {device!r}; use cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: specray runs on cpu or cuda")
    return dev


def check_engine_args(device: str, kv_cache_tokens: int, block_size: int, max_num_seqs: int = 1,
                      kernels: str = "exact", dtype: torch.dtype = torch.float32) -> None:
    """The in-process engine's device must be here, its KV cache hold a block, its batch a sequence,
    and the fast kernels get fp32 weights on a CPU: ValueError saying why (torch's RuntimeError, a
    bare assertion, or plain torch in silence, otherwise)."""
    dev = parse_device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: this machine or torch build has no CUDA device")
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
    if not isinstance(kv_cache_tokens, int) or kv_cache_tokens < block_size:
        raise ValueError(f"kv_cache_tokens must be an integer >= block_size ({block_size}), got {kv_cache_tokens!r}")
    if not isinstance(max_num_seqs, int) or isinstance(max_num_seqs, bool) or max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be an integer >= 1, got {max_num_seqs!r}")
    check_kernel_setting(kernels)  # before the weights load
    if kernels == KERNELS_AUTO:  # a mode that fits the weights, device and dtype (`loader.load_model`)
        return
    if kernels != "exact" and dev.type == "cpu" and dtype != torch.float32:
        raise ValueError(f"kernels={kernels!r} runs the C kernels on fp32 weights; dtype {dtype_name(dtype)} "
                         "would run plain torch: use dtype float32 or kernels 'exact'")
    if kernels != "exact" and dev.type != "cpu":
        raise ValueError(f"kernels={kernels!r} is a CPU kernels' mode; on {device!r} it would do nothing: "
                         "use kernels 'exact'")


def check_int_arg(name: str, value, least: int, optional: bool = False) -> None:
    """An integer argument >= least (None where optional): ValueError naming it otherwise."""
    if value is None and optional:
        return
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}{' or None' if optional else ''}, got {value!r}")


def is_token_id(t) -> bool:
    """An integer (Python's, NumPy's or a 0-d tensor's), not a bool."""
    return isinstance(t, numbers.Integral) and not isinstance(t, bool) or (
        isinstance(t, torch.Tensor) and t.dim() == 0 and not t.is_floating_point() and t.dtype != torch.bool)


def token_ids(ids) -> list:
    """Token ids as Python ints (NumPy's and tensors' too); anything else is left for the
    router's check to name."""
    return [int(t) if is_token_id(t) else t for t in ids]


def dtype_name(dtype: torch.dtype) -> str:
    return next(name for name, d in DTYPES.items() if d == dtype)


def as_list(prompts) -> list:
    """One prompt (a string, a dict or a list of token ids) as a list of one; a list of prompts as is."""
    if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and is_token_id(prompts[0])):
        return [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise ValueError("prompts must be a string, a list of token ids, a dict or a list of those, got "
                         f"{type(prompts).__name__}")
    return list(prompts)


def params_list(sampling_params, n: int) -> list[SamplingParams]:
    """One SamplingParams for every prompt, or one per prompt; None: the defaults."""
    if sampling_params is None or isinstance(sampling_params, SamplingParams):
        return [sampling_params or SamplingParams()] * n
    if not (isinstance(sampling_params, (list, tuple)) and all(isinstance(p, SamplingParams) for p in sampling_params)):
        raise ValueError("sampling_params must be a SamplingParams or a list of them (one per prompt), got "
                         f"{type(sampling_params).__name__}")
    if len(sampling_params) != n:
        raise ValueError(f"sampling_params must be one SamplingParams or one per prompt: {len(sampling_params)} "
                         f"for {n} prompts")
    return list(sampling_params)


def check_conversation(messages, index: int) -> None:
    """Each message a {"role": str, "content": str} (the template would fail deep inside otherwise)."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"conversation {index}: a non-empty list of messages, got {messages!r}")
    for j, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise ValueError(f"conversation {index}, message {j}: needs a string 'role' and 'content', got {m!r}")
        if m["role"] not in CHAT_ROLES:  # as the HTTP and gRPC APIs answer
            raise ValueError(f"conversation {index}, message {j}: role must be one of {list(CHAT_ROLES)}, "
                             f"got {m['role']!r}")
        check_text(m["content"], f"conversation {index}, message {j}, content")


class OneThread:
    """The in-process engine runs its rounds on its caller's thread: a call from a second thread
    while one is under way would step the router at the same time and take the other's outputs
    (a request went missing from its results). Refused by name instead; one thread may interleave
    its own calls and open streams."""

    def __init__(self):
        self._lock = threading.Lock()
        self._calls: dict[int, int] = {}  # thread id -> its calls and open streams

    @contextmanager
    def held(self):
        me = threading.get_ident()
        with self._lock:
            if any(thread != me for thread in self._calls):
                raise RuntimeError("this LLM is generating on another thread; an LLM serves one thread at a time "
                                   "(give each thread its own LLM, or serve with AsyncRouter / specray serve)")
            self._calls[me] = self._calls.get(me, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._calls[me] -= 1
                if not self._calls[me]:
                    del self._calls[me]
