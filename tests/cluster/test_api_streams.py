"""LLM.stream: one prompt or many, streams left early or held while other calls run the rounds,
bad input refused at the call."""

import pytest

from specray import LLM, SamplingParams

GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_target, tiny_draft):
    return LLM(str(tiny_target), speculative_config={"model": str(tiny_draft), "num_speculative_tokens": 3},
               max_model_len=64, kv_cache_tokens=4096)


def test_stream_takes_one_prompt_as_generate_does(llm):
    """A string is one prompt (it was streamed as one request a character)."""
    want = llm.generate("w5 w6", SamplingParams(max_tokens=3, **GREEDY))[0]
    outs = list(llm.stream("w5 w6", SamplingParams(max_tokens=3, **GREEDY)))
    assert {o.request_id for o in outs} == {outs[-1].request_id} and outs[-1].outputs[0].text == want.outputs[0].text


def test_a_stream_left_early_ends_its_requests(llm):
    """Its requests kept running, and the next generate decoded them all before its own."""
    for i, _ in enumerate(llm.stream(["w5 w6", "w7"], SamplingParams(max_tokens=40, **GREEDY))):
        if i == 1:
            break
    assert not llm.router.has_unfinished()
    held = llm.stream("w5 w6", SamplingParams(max_tokens=40, **GREEDY))
    next(held)  # a stream still held runs on; generate returns once its own requests end
    out = llm.generate("w8", SamplingParams(max_tokens=2, **GREEDY))
    assert len(out[0].outputs[0].token_ids) == 2 and llm.router.has_unfinished()
    held.close()
    assert not llm.router.has_unfinished()


def test_a_stream_refuses_bad_input_at_the_call_and_starts_nothing_until_read(llm):
    """It raised only at the first next(), far from the call that caused it."""
    with pytest.raises(ValueError, match="prompt 1: .*token ids"):
        llm.stream(["w5", {"prompt_token_ids": [10**9]}], SamplingParams(max_tokens=3, **GREEDY))
    with pytest.raises(ValueError, match="sampling_params must be one SamplingParams or one per prompt"):
        llm.stream(["w5", "w6"], [SamplingParams(max_tokens=3)])
    unread = llm.stream("w5 w6", SamplingParams(max_tokens=3, **GREEDY))
    assert not llm.router.has_unfinished()  # a stream never read runs nothing on later calls' rounds
    del unread
    assert len(llm.generate("w7", SamplingParams(max_tokens=2, **GREEDY))) == 1


def test_a_stream_checks_its_parameters_again_when_its_requests_start(llm):
    """A stream adds its requests at its first next(): a field changed since the call is refused
    then, by name (generate, which checks and adds in one call, checks each request once)."""
    params = SamplingParams(max_tokens=3, **GREEDY)
    stream = llm.stream("w5 w6", params)
    params.n = 10_000  # a valid SamplingParams, but more choices than this engine's running batch holds
    with pytest.raises(ValueError, match="exceeds max_num_seqs"):
        next(stream)
    assert not llm.router.has_unfinished()
    params.n = 1
    assert len(llm.generate("w5 w6", params)[0].outputs[0].token_ids) == 3


def test_a_held_stream_gets_its_outputs_after_another_call_ran_its_rounds(llm):
    """generate (or a second stream) stepped the shared router and dropped the held stream's outputs:
    it then ended without its requests' final outputs; a second stream yielded the first's."""
    params = SamplingParams(max_tokens=12, **GREEDY)
    want = [o.outputs[0].token_ids for o in llm.generate(["w5 w6", "w7"], params)]
    held = llm.stream(["w5 w6", "w7"], params)
    first = next(held)
    llm.generate("w8", SamplingParams(max_tokens=30, **GREEDY))  # runs the held stream's requests to the end
    other = list(llm.stream("w9", SamplingParams(max_tokens=3, **GREEDY)))
    assert {o.request_id for o in other} == {other[-1].request_id} != {first.request_id}
    finals = {o.request_id: o.outputs[0].token_ids for o in [first, *held] if o.finished}
    assert sorted(finals.values()) == sorted(want) and not llm.router.has_unfinished()


def test_a_second_thread_is_refused_while_one_generates(llm):
    """Two threads' calls stepped the router at once and took each other's outputs (a request went
    missing from its results): the second is refused by name; one thread's own calls interleave."""
    import threading

    greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    stream = llm.stream({"prompt_token_ids": [5, 6]}, greedy)
    next(stream)  # open on this thread
    errors = []

    def other():
        try:
            llm.generate({"prompt_token_ids": [7, 8]}, greedy)
        except RuntimeError as e:
            errors.append(e)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert errors and "another thread" in str(errors[0])
    assert len(llm.generate({"prompt_token_ids": [7, 8]}, greedy)[0].outputs[0].token_ids) == 4  # this thread's
    assert list(stream)[-1].finished
    later = []
    thread = threading.Thread(target=lambda: later.append(llm.generate({"prompt_token_ids": [7, 8]}, greedy)))
    thread.start()
    thread.join()  # free again: another thread may use it once this one is done
    assert len(later) == 1 and len(later[0][0].outputs[0].token_ids) == 4
