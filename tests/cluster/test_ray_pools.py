"""Draft and target pools on a multi-node Ray cluster on one machine: placement on the right nodes,
outputs equal to the in-process engine, and a draft worker killed mid-generation costs nothing."""

import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from specray import LLM, SamplingParams  # noqa: E402
from specray.actors.specs import DraftSpec, TargetSpec  # noqa: E402
from specray.cluster.engine import Engine, engine_config  # noqa: E402
from specray.cluster.spec_config import SpeculativeConfig  # noqa: E402
from specray.kernels.config import ModelConfig  # noqa: E402
from specray.kernels.loader import Checkpoint  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
PROMPTS = [[1, 3 + i, 17, 40 + 2 * i, 9] * (1 + i % 3) for i in range(6)]


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    nodes = {"draft": c.add_node(num_cpus=1, resources={"draft": 1}),
             "target": c.add_node(num_cpus=1, resources={"target": 1})}
    ray.init(address=c.address)
    yield nodes
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def pools(cluster, tiny_target, tiny_draft):
    from specray.cluster.pools import RayDraftPool, RayTargetPool

    target = RayTargetPool(TargetSpec(str(tiny_target), num_blocks=512, threads=1))
    draft = RayDraftPool(DraftSpec("draft_model", str(tiny_draft), num_blocks=512, threads=1))
    return target, draft


def make_engine(pools, tiny_target):
    checkpoint = Checkpoint(tiny_target, "tiny")
    spec = SpeculativeConfig(method="draft_model", model="d", num_speculative_tokens=3)
    tok = checkpoint.tokenizer()
    config, eos = engine_config(ModelConfig.from_hf(checkpoint.hf_config()), tok, spec, None, 8, 512, 16)
    return Engine(pools[0], pools[1], tok, eos, config)


def run(engine, prompts):
    ids = [engine.add_request(p, GREEDY) for p in prompts]
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return [done[i] for i in ids]


@pytest.fixture(scope="module")
def reference(tiny_target):
    llm = LLM(str(tiny_target))
    return [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY)]


def test_workers_land_on_their_nodes(cluster, pools):
    target, draft = pools
    assert target.node_id() == cluster["target"].node_id
    assert draft.node_id() == cluster["draft"].node_id


def test_pooled_outputs_equal_in_process(pools, tiny_target, reference):
    outs = run(make_engine(pools, tiny_target), PROMPTS)
    assert [o.outputs[0].token_ids for o in outs] == reference
    assert sum(o.metrics.num_draft_tokens for o in outs) > 0


def test_killing_the_draft_worker_loses_nothing(pools, tiny_target, reference):
    import time

    engine = make_engine(pools, tiny_target)
    ids = [engine.add_request(p, GREEDY) for p in PROMPTS]
    done = {}
    for _ in range(3):
        engine.step()
    ray.kill(pools[1].actor, no_restart=False)  # Ray restarts it; the engine decodes target-only meanwhile
    drafted_at_kill = engine.stats.num_draft_tokens
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
        time.sleep(0.01)
    assert [done[i].outputs[0].token_ids for i in ids] == reference
    deadline = time.monotonic() + 180
    while not pools[1].healthy:  # Ray restarts the worker (a fresh process loads the draft again)
        assert time.monotonic() < deadline, "the draft worker did not come back"
        time.sleep(0.2)
    again = run(engine, PROMPTS)  # speculation resumes, rebuilt from the full histories
    assert [o.outputs[0].token_ids for o in again] == reference
    assert engine.stats.num_draft_tokens > drafted_at_kill
