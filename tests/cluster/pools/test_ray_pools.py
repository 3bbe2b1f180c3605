"""Draft and target pools on a multi-node Ray cluster on one machine: placement on the right nodes,
outputs equal to the in-process engine for every draft transport, a draft worker killed
mid-generation costs nothing (a lost target worker: test_target_failures.py)."""

import os
import threading
import time

import pytest

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.xdist_group("ray")  # one Ray cluster at a time (tests/conftest.py)

from pool_helpers import GREEDY, PROMPTS, SAMPLED, config, in_process_outputs, make_engine, run  # noqa: E402

from specray.cluster.config.serve import ServeConfig  # noqa: E402
from specray.cluster.config.worker_specs import serve_target_spec  # noqa: E402
from specray.cluster.pools.build import build_draft_pool, placement  # noqa: E402
from specray.cluster.router.limits import router_limits  # noqa: E402
from specray.cluster.router.router import Router  # noqa: E402
from specray.kernels.config import ModelConfig  # noqa: E402
from specray.kernels.loader import Checkpoint  # noqa: E402

@pytest.fixture(scope="module")
def target_pool(ray_cluster, tiny_target, tiny_draft):
    from specray.cluster.pools.ray_pools import RayTargetPool

    cfg = config(tiny_target, tiny_draft)
    pool = RayTargetPool(serve_target_spec(cfg), placement(cfg.pools.target))
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def draft_pool(ray_cluster, tiny_target, tiny_draft):
    pool = build_draft_pool(config(tiny_target, tiny_draft))
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def reference(tiny_target, tiny_draft):
    return in_process_outputs(tiny_target, tiny_draft)


def test_workers_land_on_their_nodes(ray_cluster, target_pool, draft_pool):
    assert target_pool.node_ids() == [ray_cluster["target"].node_id]
    assert draft_pool.node_id() == ray_cluster["draft"].node_id
    # workers on other nodes than the router's take Ray actor calls (no same-node channel)
    assert target_pool.calls.get(target_pool.actors[0]) is None and draft_pool.calls.get(draft_pool.actor) is None


@pytest.mark.parametrize("pipelined", [False, True])
@pytest.mark.parametrize("budget", [None, 4])  # 4: every prompt prefills in chunks, over Ray
def test_pooled_outputs_equal_in_process(target_pool, draft_pool, tiny_target, reference, pipelined, budget):
    outs = run(make_engine(target_pool, draft_pool, tiny_target, pipelined, budget), PROMPTS)
    assert [o.outputs[0].token_ids for o in outs] == reference[0]
    accepted = [o.metrics.num_accepted_tokens for o in outs]
    assert sum(o.metrics.num_draft_tokens for o in outs) > sum(accepted) > 0 and len(set(accepted)) > 1


def test_the_round_breakdown_reads_each_workers_compute(target_pool, draft_pool, tiny_target):
    """`specray bench cluster`'s ray_pools path: each remote worker reports its own compute (the
    router times only its wait after submitting, so over a short hop compute may exceed it)."""
    from specray.cluster.bench.cluster import measured_loop

    m = measured_loop(make_engine(target_pool, draft_pool, tiny_target), PROMPTS[:4], GREEDY, 2)["round_ms"]
    assert 0 < m["target_compute"] != m["target_wait"] and 0 < m["draft_compute"] != m["draft_wait"]
    assert m["router"] > 0 and abs(m["wall"] - m["target_wait"] - m["draft_wait"] - m["router"]) < 0.01


def test_killing_the_draft_worker_loses_nothing(target_pool, draft_pool, tiny_target, reference):
    router = make_engine(target_pool, draft_pool, tiny_target, pipelined=True)
    ids = [router.add_request(p, GREEDY) for p in PROMPTS]
    done = {}
    for _ in range(3):
        router.step()
    ray.kill(draft_pool.actor, no_restart=False)  # Ray restarts it; the engine decodes target-only meanwhile
    drafted_at_kill = router.stats.num_draft_tokens
    while router.has_unfinished():
        for out in router.step():
            if out.finished:
                done[out.request_id] = out
        time.sleep(0.01)
    assert [done[i].outputs[0].token_ids for i in ids] == reference[0]
    assert router.stats.draft_fallbacks >= 1
    deadline = time.monotonic() + 180
    while not draft_pool.healthy:  # Ray restarts the worker (a fresh process loads the draft again)
        assert time.monotonic() < deadline, "the draft worker did not come back"
        time.sleep(0.2)
    again = run(router, PROMPTS)  # speculation resumes, rebuilt from the full histories
    assert [o.outputs[0].token_ids for o in again] == reference[0]
    assert router.stats.num_draft_tokens > drafted_at_kill


@pytest.fixture()
def grpc_drafter(tiny_draft):
    from specray.actors.specs import DraftSpec
    from specray.cluster.pools.draft_endpoint import DraftEndpoint
    from specray.cluster.pools.grpc_transport import serve_drafter

    server, port = serve_drafter(DraftEndpoint.from_spec(DraftSpec("draft_model", str(tiny_draft), threads=1)),
                                 "127.0.0.1:0")
    yield f"127.0.0.1:{port}"
    server.stop(grace=0)


@pytest.mark.parametrize("transport", ["ray", "torch_distributed", "grpc", "inline"])
def test_every_transport_gives_identical_outputs(target_pool, tiny_target, tiny_draft, reference, transport,
                                                 request):
    cfg = config(tiny_target, tiny_draft, transport)
    if transport == "grpc":
        cfg = cfg.with_overrides(**{"transport.drafter_address": request.getfixturevalue("grpc_drafter")})
    if transport == "torch_distributed":  # the rendezvous on the port set (it took a random one)
        from specray.cluster.serve.http_server import free_port

        cfg = cfg.with_overrides(**{"transport.master_port": free_port()})
    pool = build_draft_pool(cfg)
    if transport == "torch_distributed":
        assert pool.address.endswith(f":{cfg.transport.master_port}")
    try:
        router = make_engine(target_pool, pool, tiny_target, pipelined=True)
        assert [o.outputs[0].token_ids for o in run(router, PROMPTS)] == reference[0]
        assert [o.outputs[0].token_ids for o in run(router, [PROMPTS[0]] * 3, SAMPLED)] == reference[1]
        stats = pool.stats
        assert stats.rounds > 0 and (stats.bytes_sent > 0 and stats.bytes_received > 0) == (transport != "inline")
    finally:
        if hasattr(pool, "close"):
            pool.close()


def test_tensor_parallel_target_pool_equals_single_worker(ray_cluster, tiny_target, tiny_draft, draft_pool,
                                                          reference):
    """Two target ranks on the target node, joined by torch.distributed (gloo): same tokens."""
    from specray.cluster.pools.ray_pools import RayTargetPool

    cfg = config(tiny_target, tiny_draft)
    pool = RayTargetPool(serve_target_spec(cfg), placement(cfg.pools.target), tp_size=2)
    try:
        assert pool.node_ids() == [ray_cluster["target"].node_id] * 2
        assert ray.get([a.call.remote("tp_info") for a in pool.actors]) == [(0, 2), (1, 2)]
        outs = run(make_engine(pool, draft_pool, tiny_target, pipelined=True), PROMPTS)
        assert [o.outputs[0].token_ids for o in outs] == reference[0]
        sampled = run(make_engine(pool, draft_pool, tiny_target), [PROMPTS[0]] * 3, SAMPLED)
        assert [o.outputs[0].token_ids for o in sampled] == reference[1]
        assert len(pool.row_costs()) > 1  # the ranks' step costs: cached on every rank, or measured by all
        measured = ray.get([a.call.remote("row_costs", True) for a in pool.actors])  # together: their collectives meet
        assert len(measured) == 2 and all(len(m) > 1 for m in measured)
    finally:
        pool.close()


@pytest.fixture(scope="module")
def deep_draft(tmp_path_factory):
    from helpers import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("deep_draft"), seed=1, num_hidden_layers=5)


@pytest.mark.parametrize("spec", [{"method": "draft_model", "tree": {"kind": "rsd_c", "branching": [2, 2, 1]}},
                                  {"method": "aded"}, {"method": "draft_model", "layer_parallel": 3},
                                  {"method": "draft_model", "layer_parallel": 2, "tree": {"kind": "topk", "k": 2}},
                                  {"method": "longspec"}])
def test_tree_aded_and_layer_parallel_drafts_through_the_ray_pool(ray_cluster, target_pool, tiny_target, tiny_draft,
                                                                  deep_draft, reference, spec, request):
    """Trees, ADED, EasySpec's layer-parallel drafting (a 5-layer draft) and LongSpec (the target's
    last-layer KV crossing to the draft actor) travel the Ray transport; greedy output stays the same."""
    raw = config(tiny_target, tiny_draft).model_dump()
    if spec["method"] == "longspec":
        draft = request.getfixturevalue("tiny_longspec")
    else:
        draft = deep_draft if "layer_parallel" in spec else tiny_draft
    raw["speculative_config"] = {**spec, "num_speculative_tokens": 3,
                                 **({"model": str(draft)} if spec["method"] != "aded" else {})}
    cfg = ServeConfig.from_dict(raw)
    pool = build_draft_pool(cfg)
    try:
        checkpoint = Checkpoint(tiny_target, "tiny")
        tok = checkpoint.tokenizer()
        limits, eos = router_limits(ModelConfig.from_hf(checkpoint.hf_config()), tok, cfg.speculative, None, 8,
                                     512, 16, True)
        outs = run(Router(target_pool, pool, tok, eos, limits), PROMPTS)
        assert [o.outputs[0].token_ids for o in outs] == reference[0]
        assert sum(o.metrics.num_draft_tokens for o in outs) > 0
    finally:
        pool.close()


@ray.remote(num_cpus=0)
def _gated(flag: str, address: str) -> str:
    """`address` once the file `flag` exists: a rendezvous probe held back by the test."""
    while not os.path.exists(flag):
        time.sleep(0.05)
    return address


def test_a_layer_parallel_draft_group_survives_losing_a_rank(ray_cluster, target_pool, tiny_target, tiny_draft,
                                                             deep_draft, reference, tmp_path, monkeypatch):
    """A draft group of 2 Ray workers joined by gloo (EasySpec across devices): greedy output equal to
    plain decoding; a killed rank costs speculation only until the pool has started a fresh group,
    and the router decodes on, target-only, while the fresh group's rendezvous is still pending."""
    from specray.cluster.pools import ray_pools

    raw = config(tiny_target, tiny_draft).model_dump()
    raw["speculative_config"] = {"method": "draft_model", "model": str(deep_draft), "num_speculative_tokens": 3,
                                 "layer_parallel": 3}
    raw["pools"]["draft"]["num_workers"] = 2
    cfg = ServeConfig.from_dict(raw)
    pool = build_draft_pool(cfg)
    flag, probe = tmp_path / "rendezvous-open", ray_pools.rendezvous_probe
    monkeypatch.setattr(ray_pools, "rendezvous_probe", lambda group: _gated.remote(str(flag), probe(group)))
    try:
        pool.ready()
        checkpoint = Checkpoint(tiny_target, "tiny")
        tok = checkpoint.tokenizer()
        limits, eos = router_limits(ModelConfig.from_hf(checkpoint.hf_config()), tok, cfg.speculative, None, 8,
                                     512, 16, False)
        router = Router(target_pool, pool, tok, eos, limits)
        ids = [router.add_request(p, GREEDY) for p in PROMPTS]
        for _ in range(3):
            router.step()
        assert router.stats.num_draft_tokens > 0
        ray.kill(pool.actors[1], no_restart=True)  # rank 0 now waits in a collective for rank 1
        done = {}

        def finish():
            while router.has_unfinished():
                done.update({o.request_id: o for o in router.step() if o.finished})

        decoding = threading.Thread(target=finish, daemon=True)
        decoding.start()
        decoding.join(timeout=120)  # a guard: a router waiting on the held-back rendezvous never ends
        assert not decoding.is_alive(), "the router waited for the fresh group's rendezvous"
        assert [done[i].outputs[0].token_ids for i in ids] == reference[0]
        assert router.stats.draft_fallbacks >= 1 and not pool.healthy and pool.actors == []
        flag.touch()
        deadline = time.monotonic() + 180
        while not pool.healthy:  # a fresh group: new actors, new rendezvous
            assert time.monotonic() < deadline, "the draft group did not come back"
            time.sleep(0.2)
        drafted = router.stats.num_draft_tokens
        assert [o.outputs[0].token_ids for o in run(router, PROMPTS)] == reference[0]
        assert router.stats.num_draft_tokens > drafted  # speculation resumed
    finally:
        flag.touch()
        pool.close()


@pytest.mark.parametrize("draft, message", [
    ({"num_workers": 2}, "needs speculative_config.layer_parallel >= 2"),
    ({"num_workers": 4}, "exceeds speculative_config.layer_parallel 3"),
])
def test_draft_group_config_errors(tiny_target, tiny_draft, draft, message):
    raw = config(tiny_target, tiny_draft).model_dump()
    raw["pools"]["draft"].update(draft)
    if draft["num_workers"] == 4:
        raw["speculative_config"]["layer_parallel"] = 3
    with pytest.raises(ValueError, match=message):
        ServeConfig.from_dict(raw)


@ray.remote(num_cpus=0)
def _rank_step(fails: bool, seconds: float = 0.0) -> int:
    """A rank's step: it raises, or it commits and answers."""
    time.sleep(seconds)
    if fails:
        raise ValueError("a bad request, or a fault of this rank alone")
    return 1


@pytest.mark.parametrize("fails, lost", [((True, True), False), ((True, False), True), ((False, True), True)])
def test_ranks_that_disagree_on_a_step_restart_the_group(ray_cluster, fails, lost):
    """Ranks that all raise: a bad request (the router fails it alone). One rank raising where another
    committed the step: their KV caches now differ, so the group counts as lost and restarts."""
    from specray.cluster.pools.ray_pending import RayPending

    refs = [_rank_step.remote(f, 0.3 * r) for r, f in enumerate(fails)]  # the second rank answers last
    pending = RayPending(refs, on_failure=lambda e: RuntimeError(f"lost: {e}"))
    with pytest.raises(RuntimeError if lost else ValueError, match="their caches differ" if lost else "bad request"):
        pending.result()
