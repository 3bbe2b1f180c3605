"""pools.colocate: the target (and a ray-transport draft) worker inside the Serve replica, beside
the router. Off by default; auto only on a one-node CPU cluster with one worker a pool; outputs do
not change."""

import asyncio
import threading

import pytest
import torch

from specray import LLM, SamplingParams
from specray.cluster.config.serve import ServeConfig
from specray.cluster.pools.compute_thread import run
from specray.cluster.pools.builder import replica_resources
from specray.cluster.pools.in_process import InlineDraftPool, InProcessTargetPool
from specray.cluster.serve.runtime import build_runtime

PROMPTS = [[1, 5 + i, 9, 5 + i, 9, 14] * (1 + i % 2) for i in range(4)]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


@pytest.mark.parametrize("pools, nodes, want", [
    ({}, 1, False),  # the default: separate actor pools
    ({"colocate": "auto"}, 1, True),
    ({"colocate": "auto"}, 2, False),  # a multi-node cluster keeps separate pools
    ({"colocate": "auto", "target": {"num_workers": 2}}, 1, False),  # tensor parallelism: ranks are actors
    ({"colocate": "auto", "draft": {"num_gpus": 1}}, 1, False),
    ({"colocate": "auto", "target": {"device": "cuda"}}, 1, False),
    ({"colocate": True}, 3, True),
])
def test_auto_colocates_on_one_cpu_node_with_one_worker_a_pool(pools, nodes, want):
    assert ServeConfig.from_dict({"pools": pools}).pools.colocated(nodes) is want


def test_colocating_a_tensor_parallel_target_or_a_draft_group_is_a_clear_error():
    with pytest.raises(ValueError, match="tensor-parallel targets and draft groups need colocate false"):
        ServeConfig.from_dict({"pools": {"colocate": True, "target": {"num_workers": 2}}})


def test_the_replica_reserves_what_it_hosts():
    pools = {"target": {"num_cpus": 2, "resources": {"target": 1}}, "draft": {"num_cpus": 1}}
    assert replica_resources(ServeConfig.from_dict({"pools": {**pools, "colocate": False}})) == {"num_cpus": 0}
    hosted = replica_resources(ServeConfig.from_dict({"pools": {**pools, "colocate": True}, "transport": {"kind": "ray"}}))
    assert hosted == {"num_cpus": 3, "num_gpus": 0, "resources": {"target": 1, "draft": 1}}
    auto = ServeConfig.from_dict({"pools": {**pools, "colocate": True}})  # the CPU default: n-gram, inline
    assert replica_resources(auto) == {**hosted, "num_cpus": 2, "resources": {"target": 1}}
    inline = ServeConfig.from_dict({"pools": {**pools, "colocate": True}, "transport": {"kind": "inline"}})
    assert replica_resources(inline)["num_cpus"] == 2  # an inline draft was never an actor
    plain = ServeConfig.from_dict({"pools": {**pools, "colocate": True}, "speculative_config": None})
    assert replica_resources(plain)["resources"] == {"target": 1}


def test_colocated_runs_one_group_in_flight():
    draft = {"method": "draft_model", "model": "d", "num_speculative_tokens": 2}
    assert ServeConfig.from_dict({"speculative_config": draft, "pools": {"colocate": False}}).pipelined
    assert not ServeConfig.from_dict({"speculative_config": draft, "pools": {"colocate": True}}).pipelined


def test_colocated_runtime_equals_in_process_greedy(tiny_target, tiny_draft):
    cfg = ServeConfig.from_dict({"model": str(tiny_target), "pools": {"colocate": True, "target": {"threads": 1}, "draft": {"threads": 2}},
                                 "speculative_config": {"method": "draft_model", "model": str(tiny_draft),
                                                        "num_speculative_tokens": 3},
                                 "router": {"kv_cache_tokens": 4096}})
    threads = run(torch.get_num_threads)
    runtime = build_runtime(cfg)
    assert run(torch.get_num_threads) == 1, "the target worker sets the compute thread's; the draft shares them"
    run(torch.set_num_threads, threads)
    try:
        assert isinstance(runtime.target_pool, InProcessTargetPool)
        assert isinstance(runtime.draft_pool, InlineDraftPool)
        router = runtime.async_router.router
        runtime.async_router.shutdown()  # drive the router from this thread
        ids = [router.add_request(p, GREEDY) for p in PROMPTS]
        done = {}
        while router.has_unfinished():
            done.update({o.request_id: o for o in router.step() if o.finished})
    finally:
        runtime.shutdown()
    want = LLM(str(tiny_target)).generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY)
    assert [done[i].outputs[0].token_ids for i in ids] == [o.outputs[0].token_ids for o in want]
    assert sum(done[i].metrics.num_draft_tokens for i in ids) > 0


def test_served_rounds_call_the_colocated_workers_on_their_own_thread(tiny_target):
    """The replica's rounds are turns on the compute thread that built the workers: a round's target
    step and n-gram proposal are direct calls, with no thread hand-off (and no second OpenMP team)."""
    cfg = ServeConfig.from_dict({"model": str(tiny_target), "pools": {"colocate": True, "target": {"threads": 1}},
                                 "speculative_config": {"method": "ngram", "num_speculative_tokens": 3},
                                 "router": {"kv_cache_tokens": 4096}})
    threads = run(torch.get_num_threads)
    runtime = build_runtime(cfg)
    run(torch.set_num_threads, threads)
    seen = {"round": set(), "target": set(), "draft": set()}
    router, target, draft = runtime.async_router.router, runtime.target_pool.worker.worker, runtime.draft_pool.worker.worker

    def recorded(name, fn):
        def call(*args):
            seen[name].add(threading.current_thread())
            return fn(*args)
        return call

    router.step = recorded("round", router.step)
    target.step = recorded("target", target.step)
    draft.propose = recorded("draft", draft.propose)

    async def answer():
        return [o async for o in runtime.async_router.generate(PROMPTS[1], GREEDY)][-1]

    try:
        out = asyncio.run(answer())
    finally:
        runtime.shutdown()
    compute = run(threading.current_thread)
    assert seen == {"round": {compute}, "target": {compute}, "draft": {compute}}
    assert out.outputs[0].token_ids == LLM(str(tiny_target)).generate([{"prompt_token_ids": PROMPTS[1]}],
                                                                        GREEDY)[0].outputs[0].token_ids


@pytest.mark.parametrize("flag, want", [([], False), (["--colocate", "auto"], "auto"), (["--colocate", "on"], True),
                                        (["--colocate", "off"], False)])
def test_the_colocate_flag(flag, want):
    from specray.cluster.cli import build_parser
    from specray.cluster.serve.cli import resolve_config

    assert resolve_config(build_parser().parse_args(["serve", *flag])).pools.colocate == want


@pytest.mark.parametrize("flag, setting", [([], "auto"), (["--kernels", "exact"], "exact"), (["--kernels", "fast"], "fast"),
                                           (["--kernels", "fast16"], "fast16")])
def test_the_kernels_flag_sets_the_target_pool(flag, setting):
    """auto (the default) reaches the worker, which loads GGUF blocks in fast16 (kernels/loader.py)."""
    from specray.cluster.cli import build_parser
    from specray.cluster.serve.cli import resolve_config

    cfg = resolve_config(build_parser().parse_args(["serve", *flag]))
    assert cfg.pools.target.kernels == setting
    from specray.cluster.config.worker_specs import serve_target_spec

    assert serve_target_spec(cfg).kernels == setting
