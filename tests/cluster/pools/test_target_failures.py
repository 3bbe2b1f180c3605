"""A target worker lost (killed) or hung (stopped) mid-generation on a Ray cluster: its requests fail
retryably and the pool recovers with fresh workers, whose outputs equal the in-process engine's."""

import pytest

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.xdist_group("ray")  # one Ray cluster at a time (tests/conftest.py)

from pool_helpers import GREEDY, PROMPTS, config, in_process_outputs, make_engine, run  # noqa: E402

from specray.cluster.config.worker_specs import serve_target_spec  # noqa: E402
from specray.cluster.pools.api import TargetUnavailable  # noqa: E402
from specray.cluster.pools.build import placement  # noqa: E402


@pytest.fixture(scope="module")
def reference(tiny_target, tiny_draft):
    return in_process_outputs(tiny_target, tiny_draft)


def test_target_failure_is_retryable_and_the_pool_recovers(ray_cluster, tiny_target, tiny_draft, reference):
    from specray.cluster.pools.ray_pools import RayTargetPool

    cfg = config(tiny_target, tiny_draft)
    pool = RayTargetPool(serve_target_spec(cfg), placement(cfg.pools.target))
    try:
        router = make_engine(pool, None, tiny_target)
        for p in PROMPTS:
            router.add_request(p, GREEDY)
        router.step()
        ray.kill(pool.actors[0], no_restart=True)
        with pytest.raises(TargetUnavailable, match="retry"):
            for _ in range(50):
                router.step()
        assert sorted(router.fail_all(), key=int) == [str(i) for i in range(len(PROMPTS))]
        assert not router.has_unfinished() and router.reserved_tokens == 0
        again = run(router, PROMPTS)  # fresh workers, same outputs
        assert [o.outputs[0].token_ids for o in again] == reference[0]
    finally:
        pool.close()


def test_a_hung_target_worker_counts_as_lost_after_its_timeout(ray_cluster, tiny_target, tiny_draft, reference):
    """A stopped (hung) worker held every request forever, its step never answering."""
    import os
    import signal

    from specray.cluster.pools.ray_pools import RayTargetPool

    cfg = config(tiny_target, tiny_draft)
    pool = RayTargetPool(serve_target_spec(cfg), placement(cfg.pools.target), timeout_s=2.0)
    try:
        router = make_engine(pool, None, tiny_target)
        for p in PROMPTS:
            router.add_request(p, GREEDY)
        router.step()
        pid = ray.get(pool.actors[0].__ray_call__.remote(lambda worker: os.getpid()))
        os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(TargetUnavailable, match="retry"):
                for _ in range(50):
                    router.step()
        finally:
            os.kill(pid, signal.SIGCONT)
        assert sorted(router.fail_all(), key=int) == [str(i) for i in range(len(PROMPTS))]
        assert [o.outputs[0].token_ids for o in run(router, PROMPTS)] == reference[0]  # fresh workers
    finally:
        pool.close()


def test_a_started_worker_loads_outside_the_step_timeout(ray_cluster, tiny_target, tiny_draft, reference):
    """target_timeout_s bounds a step: a fresh worker's start (its process, torch, the weights) took
    longer than a short one, so a restarted pool was killed again at its first step, and again (a
    same-node channel's opening hid it: Ray actor calls, as to a worker on another node)."""
    from specray.cluster.pools.ray_pools import RayTargetPool

    cfg = config(tiny_target, tiny_draft)
    pool = RayTargetPool(serve_target_spec(cfg), placement(cfg.pools.target), channel=False, timeout_s=2.0)
    try:
        router = make_engine(pool, None, tiny_target)
        assert [o.outputs[0].token_ids for o in run(router, PROMPTS)] == reference[0]  # no pool.ready() first
        ray.kill(pool.actors[0], no_restart=True)
        router.add_request(PROMPTS[0], GREEDY)
        with pytest.raises(TargetUnavailable, match="retry"):
            router.step()
        router.fail_all()
        assert [o.outputs[0].token_ids for o in run(router, PROMPTS)] == reference[0]  # the restarted pool
        assert pool.starts == 2
    finally:
        pool.close()
