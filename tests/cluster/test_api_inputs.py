"""The Python API's inputs as vLLM users pass them: SamplingParams changed after construction are held
to the same rules, engine arguments and bool options of the wrong type are refused by name, NumPy
token ids work, a lone chat message and options that leave no token to draw are clear errors."""

import numpy as np
import pytest

from specray import LLM, SamplingParams

GREEDY = dict(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPT = [1, 5, 9, 5, 9, 12]


@pytest.fixture(scope="module")
def llm(tiny_target):
    return LLM(str(tiny_target), kv_cache_tokens=1024)


@pytest.mark.parametrize("field, value", [("temperature", -1.0), ("max_tokens", 0), ("top_p", 1.5), ("n", 0)])
def test_a_field_changed_after_construction_is_checked_again(llm, field, value):
    params = SamplingParams(**GREEDY)
    setattr(params, field, value)
    with pytest.raises(ValueError, match=f"prompt 0: {field} must"):  # before anything runs, named
        llm.generate({"prompt_token_ids": PROMPT}, params)
    assert llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(**GREEDY))[0].outputs[0].token_ids  # still serves


def test_a_stop_string_set_after_construction_is_one_string(llm, tiny_target):
    """A bare string assigned to `stop` is one stop string, as in the constructor (it was taken as a
    list of its characters)."""
    text = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(**{**GREEDY, "max_tokens": 16}))[0].outputs[0].text
    stop = text[len(text) // 2:][:3]
    assert len(stop) >= 2
    want = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(**{**GREEDY, "max_tokens": 16}, stop=stop))[0]
    params = SamplingParams(**{**GREEDY, "max_tokens": 16})
    params.stop = stop
    got = llm.generate({"prompt_token_ids": PROMPT}, params)[0]
    assert (got.outputs[0].text, got.outputs[0].stop_reason) == (want.outputs[0].text, want.outputs[0].stop_reason)


@pytest.mark.parametrize("kwargs, name", [({"seed": "abc"}, "seed"), ({"seed": 2**64}, "seed"),
                                          ({"max_model_len": "128"}, "max_model_len"),
                                          ({"max_model_len": 0}, "max_model_len")])
def test_engine_arguments_of_the_wrong_type_are_refused_by_name(tiny_target, kwargs, name):
    with pytest.raises(ValueError, match=f"^{name} must be an integer"):
        LLM(str(tiny_target), **kwargs)


def test_seed_none_is_an_unseeded_engine(tiny_target):
    out = LLM(str(tiny_target), seed=None).generate({"prompt_token_ids": PROMPT}, SamplingParams(**GREEDY))[0]
    assert len(out.outputs[0].token_ids) == GREEDY["max_tokens"]


def test_numpy_token_ids_are_token_ids(llm):
    want = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(**GREEDY))[0].outputs[0].token_ids
    ids = np.array(PROMPT)
    for prompt in ({"prompt_token_ids": ids}, list(ids)):
        out = llm.generate(prompt, SamplingParams(**GREEDY))[0]
        assert out.outputs[0].token_ids == want and out.prompt_token_ids == PROMPT
        assert all(type(t) is int for t in out.prompt_token_ids)


def test_numpy_numbers_are_sampling_numbers(llm):
    """`max_tokens=np.int64(8)` (a length from an array) was refused; such numbers become Python's."""
    want = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(**GREEDY))[0].outputs[0].token_ids
    numpy = SamplingParams(**{**GREEDY, "max_tokens": np.int64(GREEDY["max_tokens"]), "temperature": np.float32(0)},
                           seed=np.uint64(3), top_k=np.int32(5), logit_bias={np.int64(7): np.float32(0.0)},
                           stop_token_ids=list(np.array([96])))
    assert type(numpy.max_tokens) is int and type(numpy.temperature) is float and type(numpy.seed) is int
    assert type(numpy.stop_token_ids[0]) is int and list(numpy.logit_bias.items()) == [(7, 0.0)]
    assert llm.generate({"prompt_token_ids": PROMPT}, numpy)[0].outputs[0].token_ids == want
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=np.bool_(True))  # a bool stays refused


def test_stop_token_ids_none_is_none(llm):
    """vLLM's default for stop_token_ids is None."""
    params = SamplingParams(**GREEDY, stop_token_ids=None)
    assert params.stop_token_ids == []
    assert llm.generate({"prompt_token_ids": PROMPT}, params)[0].outputs[0].token_ids


@pytest.mark.parametrize("name", ["ignore_eos", "include_stop_str_in_output", "skip_special_tokens"])
def test_a_bool_option_takes_only_a_bool(name):
    """A truthy string took effect: ignore_eos="no" ignored EOS."""
    with pytest.raises(ValueError, match=f"{name} must be True or False, got 'no'"):
        SamplingParams(**{name: "no"})


def test_one_message_alone_is_not_a_conversation(llm):
    """It raised KeyError: 0."""
    with pytest.raises(ValueError, match="got one message alone: put it in a list"):
        llm.chat({"role": "user", "content": "hi"})


@pytest.mark.parametrize("kwargs, message", [(dict(pipelined="no"), "pipelined must be True or False, got 'no'"),
                                             (dict(kernels="bogus"), "kernels must be one of"),
                                             (dict(max_prefill_tokens=0), "max_prefill_tokens must be a positive"),
                                             (dict(max_prefill_tokens="all"), "max_prefill_tokens must be a positive")])
def test_engine_flags_of_the_wrong_kind_fail_before_the_weights_load(tiny_target, monkeypatch, kwargs, message):
    import specray.cluster.llm as llm_module

    monkeypatch.setattr(llm_module, "load_model", lambda *a, **k: pytest.fail("the target must not load"))
    with pytest.raises(ValueError, match=message):
        LLM(str(tiny_target), **kwargs)


def test_allowed_tokens_that_min_tokens_bans_all_are_refused(llm):
    """Every allowed token an EOS or stop token id, with min_tokens: the first row has no token left,
    and every path emitted an arbitrary one (the tree rules even accepted a draft's)."""
    eos = sorted(llm.router.eos_token_ids)[0]
    for params in (SamplingParams(allowed_token_ids=[7], stop_token_ids=[7], min_tokens=1, max_tokens=3),
                   SamplingParams(allowed_token_ids=[eos], min_tokens=2, max_tokens=3)):
        with pytest.raises(ValueError, match="no token could be drawn"):
            llm.generate({"prompt_token_ids": [5, 6]}, params)
    assert not llm.router.has_unfinished()
    other = SamplingParams(allowed_token_ids=[7, 8], stop_token_ids=[7], min_tokens=1, max_tokens=3, temperature=0)
    assert llm.generate({"prompt_token_ids": [5, 6]}, other)[0].outputs[0].token_ids[0] == 8  # the one left
    kept = SamplingParams(allowed_token_ids=[eos], min_tokens=2, max_tokens=3, ignore_eos=True)  # EOS ends nothing
    assert llm.generate({"prompt_token_ids": [5, 6]}, kept)[0].outputs[0].token_ids == [eos] * 3


def test_allowed_tokens_that_bad_words_ban_all_are_refused(llm):
    """One-token bad words that ban every allowed token (or every one min_tokens leaves): every path
    emitted a token outside allowed_token_ids (the processed row was all -inf)."""
    for params, message in ((SamplingParams(allowed_token_ids=[5], bad_words=["w5"], max_tokens=3), "bad_words ban"),
                            (SamplingParams(allowed_token_ids=[7, 8], stop_token_ids=[7], min_tokens=1,
                                            bad_words=["w8"], max_tokens=3), "or is a bad word")):
        with pytest.raises(ValueError, match=f"{message}.*no token could be drawn"):
            llm.generate({"prompt_token_ids": [5, 6]}, params)
    assert not llm.router.has_unfinished()
    left = SamplingParams(allowed_token_ids=[5, 6], bad_words=["w5"], max_tokens=3, temperature=0)
    assert llm.generate({"prompt_token_ids": [5, 6]}, left)[0].outputs[0].token_ids == [6, 6, 6]


def test_a_context_of_one_token_is_refused_before_the_weights_load(tiny_target, monkeypatch):
    """max_model_len 1 leaves no token to generate: it failed after the model loaded."""
    import specray.cluster.llm as llm_module

    monkeypatch.setattr(llm_module, "load_model", lambda *a, **k: pytest.fail("the target must not load"))
    with pytest.raises(ValueError, match="max_model_len"):
        LLM(str(tiny_target), max_model_len=1)


def test_an_unreadable_prompt_file_is_one_line(tmp_path, monkeypatch):
    from pathlib import Path

    from specray.cluster.bench.prompts import read_lines

    path = tmp_path / "prompts.txt"
    path.write_text("hi\n")
    monkeypatch.setattr(Path, "read_text", lambda *a, **k: (_ for _ in ()).throw(PermissionError(13, "Permission denied")))
    with pytest.raises(ValueError, match="cannot be read: Permission denied"):
        read_lines(path)
