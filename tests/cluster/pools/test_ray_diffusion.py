"""A diffusion LM's worker as a Ray actor on the target node: the served runtime returns the
in-process tokens (FreeDave on), and a killed worker fails its requests retryably, then recovers."""

import asyncio

import pytest

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.xdist_group("ray")  # one Ray cluster at a time (tests/conftest.py)

from diffusion_helpers import save_tiny_dllm  # noqa: E402

from specray import LLM, SamplingParams  # noqa: E402
from specray.cluster.config.serve import ServeConfig  # noqa: E402
from specray.cluster.pools.api import TargetUnavailable  # noqa: E402
from specray.cluster.serve.runtime import build_runtime  # noqa: E402

PROMPTS = [[5 + i, 17, 40 + 2 * i, 9][: 1 + i % 4] for i in range(6)]
PARAMS = [SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
          SamplingParams(temperature=1.0, seed=3, max_tokens=7, ignore_eos=True)]


@pytest.fixture(scope="module")
def dllm(tmp_path_factory):
    return save_tiny_dllm(tmp_path_factory.mktemp("dllm"), "llada", scale=6.0)


def config(dllm) -> ServeConfig:
    return ServeConfig.from_dict({"model": str(dllm), "speculative_config": {"method": "freedave", "num_drafts": 3},
                                  "diffusion_config": {"block_length": 4}, "router": {"max_num_seqs": 4},
                                  "pools": {"target": {"threads": 1}, "colocate": False}})


def reference(dllm):
    llm = LLM(str(dllm), speculative_config={"method": "freedave", "num_drafts": 3}, diffusion_config={"block_length": 4})
    return [[o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)]
            for params in PARAMS]


async def served(runtime, params):
    async def one(p):
        last = None
        async for out in runtime.async_router.generate(p, params):
            last = out
        return last.outputs[0].token_ids
    return await asyncio.gather(*(one(p) for p in PROMPTS))


def test_served_runtime_on_ray_equals_in_process_and_recovers(ray_cluster, dllm):
    want = reference(dllm)
    runtime = build_runtime(config(dllm))
    try:
        assert runtime.draft_pool is None and type(runtime.target_pool).__name__ == "RayDiffusionPool"
        # a hung worker counts as lost after the router's timeout (it blocked every request for good)
        assert runtime.target_pool.timeout_s == config(dllm).router.target_timeout_s
        for params, tokens in zip(PARAMS, want):
            assert asyncio.run(served(runtime, params)) == tokens
        router = runtime.router
        runtime.async_router.shutdown()  # drive the router by hand from here
        first = [router.add_request(p, PARAMS[0]) for p in PROMPTS]
        router.step()
        ray.kill(runtime.target_pool.actor, no_restart=True)
        with pytest.raises(TargetUnavailable, match="retry"):
            for _ in range(50):
                router.step()
        lost = set(router.fail_all())  # those that emitted a block; the others run again
        done = {}
        while router.has_unfinished():
            done.update({o.request_id: o.outputs[0].token_ids for o in router.step() if o.finished})
        assert set(done) == set(first) - lost and all(done[i] == w for i, w in zip(first, want[0]) if i in done)
        ids = [router.add_request(p, PARAMS[0]) for p in PROMPTS]
        while router.has_unfinished():
            done.update({o.request_id: o.outputs[0].token_ids for o in router.step() if o.finished})
        assert [done[i] for i in ids] == want[0]  # a fresh worker, the same tokens
    finally:
        runtime.shutdown()
