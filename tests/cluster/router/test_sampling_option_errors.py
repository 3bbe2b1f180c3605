"""The sampling options' bad values, refused by name before anything runs: min_p, logit_bias, the
penalties, bad_words without a tokenizer, token ids outside the vocabulary."""

import pytest

from specray import LLM, SamplingParams

from router_helpers import PROMPT


@pytest.mark.parametrize("value, message", [(1.5, "min_p"), (float("nan"), "min_p")])
def test_bad_min_p_is_refused_by_name(value, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(min_p=value)


@pytest.mark.parametrize("bias", [{"5": 1.0}, {5: 101.0}, {-1: 1.0}, {5: float("inf")}, [5]])
def test_bad_logit_bias_is_refused_by_name(bias):
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=bias)


def test_bad_words_need_a_tokenizer(tiny_target):
    with pytest.raises(ValueError, match="bad_words need a tokenizer"):
        LLM(str(tiny_target), skip_tokenizer_init=True).generate(PROMPT, SamplingParams(bad_words=["w5"]))


def test_a_token_id_outside_the_vocabulary_is_refused(tiny_target):
    with pytest.raises(ValueError, match=r"logit_bias token ids must be in \[0, "):
        LLM(str(tiny_target)).generate(PROMPT, SamplingParams(logit_bias={10**6: 1.0}))


@pytest.mark.parametrize("field, value", [("presence_penalty", 2.5), ("frequency_penalty", float("nan")),
                                          ("repetition_penalty", 0.0), ("repetition_penalty", float("inf"))])
def test_bad_penalties_are_refused_by_name(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("field", ["stop", "bad_words"])
def test_a_stop_string_or_bad_word_past_its_length_is_refused_by_name(field):
    """Each is tokenized or indexed on the rounds' thread when its request is added: megabytes of
    them stalled every other stream."""
    from specray.cluster.params import MAX_STOP_CHARS

    SamplingParams(**{field: ["w" * MAX_STOP_CHARS]})
    with pytest.raises(ValueError, match=f"{field}.*{MAX_STOP_CHARS} characters") as e:
        SamplingParams(**{field: ["w" * (MAX_STOP_CHARS + 1)]})
    assert e.value.param == field


def test_allowed_token_ids_past_any_vocabulary_are_refused_and_a_rows_index_is_built_once():
    """A million ids (repeats) cost the rounds' thread 0.2 s to sort, and a vocabulary-wide list was
    rebuilt into an index for every row of every round."""
    import torch

    from specray.cluster.params import MAX_ALLOWED_IDS
    from specray.kernels import sampling

    with pytest.raises(ValueError, match="allowed_token_ids") as e:
        SamplingParams(allowed_token_ids=[5] * (MAX_ALLOWED_IDS + 1))
    assert e.value.param == "allowed_token_ids"
    cfg = SamplingParams(allowed_token_ids=[3, 1, 3]).sampling_config()
    rows = sampling.apply_logit_bias(torch.zeros(2, 5), [cfg, cfg])
    assert rows[0].tolist() == rows[1].tolist() == [float("-inf"), 0, float("-inf"), 0, float("-inf")]
    wide = SamplingParams(allowed_token_ids=list(range(0, 2 * sampling.MIN_INDEXED_IDS, 2))).sampling_config()
    assert sampling._index(wide.allowed_token_ids, "cpu") is sampling._index(wide.allowed_token_ids, "cpu")
    for _ in range(sampling.MAX_INDEXED_IDS // len(wide.allowed_token_ids) + 2):  # the cache stays bounded
        sampling._index(tuple(list(wide.allowed_token_ids)), "cpu")  # a new tuple each time
    assert sum(len(t) for t, _ in sampling._INDEXES.values()) <= sampling.MAX_INDEXED_IDS


@pytest.mark.parametrize("field", ["stop", "bad_words"])
def test_a_stop_string_or_bad_word_that_is_no_text_is_refused_by_name(field):
    """A lone surrogate: the offline API raised the tokenizer's UnicodeEncodeError."""
    with pytest.raises(ValueError, match="valid Unicode") as e:
        SamplingParams(**{field: ["w5", "\ud800"]})
    assert e.value.param == field
