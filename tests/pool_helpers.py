"""The tiny speculative config, router and run loop the Ray pool tests share."""

from specray import LLM, SamplingParams
from specray.cluster.config.serve import ServeConfig
from specray.cluster.router.limits import router_limits
from specray.cluster.router.router import Router
from specray.kernels.config import ModelConfig
from specray.kernels.loader import Checkpoint

GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
SAMPLED = [SamplingParams(temperature=1.0, top_p=0.9, seed=7 + i, max_tokens=12, ignore_eos=True) for i in range(3)]
PROMPTS = [[1, 3 + i, 17, 40 + 2 * i, 9] * (1 + i % 3) for i in range(6)]


def config(tiny_target, tiny_draft, transport="ray", **router):
    return ServeConfig.from_dict({
        "model": str(tiny_target),
        "speculative_config": {"method": "draft_model", "model": str(tiny_draft), "num_speculative_tokens": 3},
        "router": {"kv_cache_tokens": 8192, "max_num_seqs": 8, **router},
        "pools": {"target": {"threads": 1}, "draft": {"threads": 1}},
        "transport": {"kind": transport, "drafter_address": "x:1" if transport == "grpc" else None}})


def make_engine(target, draft, tiny_target, pipelined=False, max_prefill_tokens=None):
    checkpoint = Checkpoint(tiny_target, "tiny")
    tok = checkpoint.tokenizer()
    spec = config(tiny_target, tiny_target).speculative
    limits, eos = router_limits(ModelConfig.from_hf(checkpoint.hf_config()), tok, spec, None, 8, 512, 16, pipelined,
                                (max_prefill_tokens, None))
    return Router(target, draft, tok, eos, limits)


def run(router, prompts, params=GREEDY):
    ids = [router.add_request(p, params if isinstance(params, SamplingParams) else params[i])
           for i, p in enumerate(prompts)]
    done = {}
    while router.has_unfinished():
        for out in router.step():
            if out.finished:
                done[out.request_id] = out
    return [done[i] for i in ids]


def in_process_outputs(tiny_target, tiny_draft) -> tuple[list, list]:
    """What every pool must reproduce: the in-process engine's greedy and seeded sampled tokens."""
    llm = LLM(str(tiny_target), speculative_config={"model": str(tiny_draft), "num_speculative_tokens": 3})
    greedy = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY)]
    sampled = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": PROMPTS[0]}] * 3, SAMPLED)]
    return greedy, sampled
