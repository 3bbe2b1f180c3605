"""A lost target (its pool restarts with empty workers): requests that emitted nothing run again from
their prompts, once, with the outputs they would have had; requests whose output began are lost
(their consumers already hold tokens). A target lost while idle failed the next request outright."""

import pytest

from specray import LLM, SamplingParams
from specray.actors.target_worker import TargetWorker
from specray.cluster.pools.api import TargetUnavailable
from specray.cluster.pools.in_process import InProcessTargetPool

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
SEEDED = SamplingParams(temperature=1.0, seed=11, max_tokens=10, ignore_eos=True, n=2)
PROMPTS = [[5, 9, 13, 5, 9], [7, 8, 9, 10, 11, 12, 13, 14], [3]]


class LosablePool(InProcessTargetPool):
    """An in-process target whose next step can be lost: it raises TargetUnavailable and the worker
    starts again empty, as a Ray pool's restart leaves it."""

    def __init__(self, worker):
        super().__init__(worker)
        self.lose_next = False

    def submit_step(self, items):
        if self.lose_next:
            self.lose_next = False
            self.worker = TargetWorker(self.worker.model, num_blocks=64, block_size=16)
            raise TargetUnavailable("a target worker failed and is restarting; its requests were lost, retry them")
        return super().submit_step(items)


@pytest.fixture(scope="module")
def want(tiny_target):
    llm = LLM(str(tiny_target))
    return [[c.token_ids for c in o.outputs] for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY)
            + llm.generate([{"prompt_token_ids": PROMPTS[0]}], SEEDED)]


@pytest.fixture()
def router(tiny_target):
    llm = LLM(str(tiny_target), speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    llm.router.target = LosablePool(llm.router.target.worker)
    return llm.router


def lose_a_round(router) -> list[str]:
    router.target.lose_next = True
    with pytest.raises(TargetUnavailable):
        router.step()
    return router.fail_all()


def finish(router) -> dict[str, list[list[int]]]:
    done = {}
    while router.has_unfinished():
        done.update({o.request_id: [c.token_ids for c in o.outputs] for o in router.step() if o.finished})
    return done


def test_requests_that_emitted_nothing_run_again_with_the_same_outputs(router, want):
    ids = [router.add_request(p, GREEDY) for p in PROMPTS] + [router.add_request(PROMPTS[0], SEEDED)]
    assert lose_a_round(router) == [] and router.has_unfinished()
    done = finish(router)
    assert [done[i] for i in ids] == want and router.reserved_tokens == 0


def test_a_request_whose_output_began_is_lost_and_the_rest_run_again(router, want):
    began = router.add_request(PROMPTS[0], GREEDY)
    router.step()  # prefill and first token
    fresh = router.add_request(PROMPTS[1], GREEDY)
    assert lose_a_round(router) == [began]
    assert finish(router) == {fresh: want[1]}


def test_a_request_runs_again_once_then_fails_with_the_next_loss(router, want):
    once = router.add_request(PROMPTS[2], GREEDY)
    assert lose_a_round(router) == []
    assert lose_a_round(router) == [once] and not router.has_unfinished() and router.reserved_tokens == 0
