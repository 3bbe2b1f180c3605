"""The request fields the OpenAI-compatible API refuses unless they hold their no-op value (vLLM's and
OpenAI's options specray does not implement), and the server's settings a request may try to send."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specray.cluster.params import NO_OP_FIELDS, is_no_op


def off(*no_ops):
    return lambda v: is_no_op(v, (None, *no_ops))


# field -> whether its value leaves the output unchanged (anything else is refused)
UNSUPPORTED: dict[str, Callable[[Any], bool]] = {
    **{name: off(*no_ops) for name, no_ops in NO_OP_FIELDS.items()},  # SamplingParams' vLLM fields
    "suffix": off(""),
    "response_format": off({"type": "text"}), "tools": off([]), "functions": off([]),
    "tool_choice": off("none", "auto"), "function_call": off("none", "auto"),
    "guided_json": off(), "guided_regex": off(), "guided_choice": off(), "guided_grammar": off(),
    # vLLM's extensions
    "guided_decoding_backend": off(), "use_beam_search": off(False), "length_penalty": off(1, 1.0),
    "return_tokens_as_token_ids": off(False), "chat_template": off(), "chat_template_kwargs": off({}),
    "reasoning_effort": off(),
    # OpenAI's newer options
    "modalities": off(["text"]), "audio": off(), "web_search_options": off(), "verbosity": off(),
    "prediction": off(),
    # vLLM's serving options: each would change the response or how the request is served
    "priority": off(0), "documents": off([]), "return_token_ids": off(False),
    "prompt_embeds": off(), "vllm_xargs": off({}), "mm_processor_kwargs": off({}), "kv_transfer_params": off(),
}
# what a refused field would have done, where that is not the output's text
EFFECTS = {"priority": "it would schedule the request by priority",
           "return_token_ids": "it would add token ids to the response",
           "kv_transfer_params": "it would move the request's KV cache between servers"}

# the server's settings a request may try to send -> where they are set
SERVER_SETTINGS = {"speculative_config": "specray serve --speculative-config",
                   "num_drafts": "specray serve --num-drafts", "block_length": "specray serve --block-length",
                   "steps_per_block": "specray serve --steps-per-block"}
