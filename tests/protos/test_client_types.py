"""The client SDK's Sampling -> wire message: a value the message cannot hold fails before any call."""

import pytest

from specray.client import Sampling
from specray.client.errors import InvalidArgumentError


@pytest.mark.parametrize("field, value", [("seed", -2**63 - 1), ("seed", 2**64), ("top_k", 2**40),
                                          ("temperature", "hot")])
def test_a_value_the_message_cannot_hold_is_an_invalid_argument_naming_its_field(field, value):
    with pytest.raises(InvalidArgumentError, match=f"^INVALID_ARGUMENT: {field}: "):
        Sampling(**{field: value}).to_proto()


def test_set_values_go_through_and_unset_ones_stay_unset():
    msg = Sampling(seed=3, stop="x", stop_token_ids=[7]).to_proto()
    assert msg.seed == 3 and list(msg.stop) == ["x"] and list(msg.stop_token_ids) == [7]
    assert not msg.HasField("max_tokens") and not msg.HasField("temperature")


def test_every_sampling_field_of_the_wire_is_the_sdks_and_the_servers():
    """A field the message has but the SDK or the server leaves out is silently dropped (a request's
    verify_budget was); each one set here must come out in the server's SamplingParams."""
    from specray.cluster.serve.grpc_convert import sampling_params
    from specray.protos.specray.v1 import generate_pb2 as pb

    values = {"max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "top_k": 3, "n": 2, "stop": ["x"],
              "stop_token_ids": [7], "seed": 11, "logprobs": 1, "ignore_eos": True, "num_speculative_tokens": 2,
              "verify_budget": 4, "prompt_logprobs": 3, "min_p": 0.25, "logit_bias": {7: -2.0},
              "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.25,
              "min_tokens": 2, "allowed_token_ids": [3, 9], "bad_words": ["foo bar"], "truncate_prompt_tokens": 6,
              "include_stop_str_in_output": True, "skip_special_tokens": False}
    assert set(values) == set(pb.SamplingParams.DESCRIPTOR.fields_by_name)
    params = sampling_params(Sampling(**values).to_proto(), default_max_tokens=16)
    for name, value in values.items():
        assert getattr(params, name) == value, name


def test_a_chat_message_s_name_reaches_the_template_as_over_http():
    """The SDK sent a message's `name` nowhere (the wire had no field); the server gives it to the
    chat template, as the HTTP API does."""
    from specray.client.request import build_request
    from specray.cluster.serve.grpc_convert import chat_messages

    request = build_request(messages=[{"role": "user", "content": "hi", "name": "bob"}, {"role": "user", "content": "x"}])
    assert chat_messages(request.chat) == [{"role": "user", "content": "hi", "name": "bob"},
                                           {"role": "user", "content": "x"}]
    with pytest.raises(ValueError, match=r"messages\[0\]\['name'\] must be a string"):
        build_request(messages=[{"role": "user", "content": "hi", "name": 5}])


@pytest.mark.parametrize("kwargs, field", [({"bad_words": "Paris"}, "bad_words"),
                                           ({"allowed_token_ids": []}, "allowed_token_ids")])
def test_a_value_the_wire_would_misread_is_refused_by_the_sdk(kwargs, field):
    """A string of bad words went out as its characters; an empty allowed list as "all tokens"
    (the HTTP API refuses both)."""
    with pytest.raises(InvalidArgumentError, match=field):
        Sampling(**kwargs).to_proto()


def test_a_negative_seed_draws_as_over_http():
    """HTTP takes seeds in [-2^63, 2^64) and folds them mod 2^63; the SDK refused negative ones (the
    wire's uint64): it sends them mod 2^64, which the server folds to the same seed."""
    from specray.cluster.params import choice_seed

    for seed in (-1, -12345, -2**63):
        sent = Sampling(seed=seed).to_proto().seed
        assert choice_seed(sent, 0) == choice_seed(seed, 0) and choice_seed(sent, 3) == choice_seed(seed, 3)


@pytest.mark.parametrize("ids, shown", [([5, 2**31 + 5], "2147483653"), ([-3, 5], "-3")])
def test_a_token_id_the_wire_cannot_hold_is_refused_naming_it(ids, shown):
    """The wire's ids are int32: 2^31 + 5 passed the SDK's check (2^32) and failed as a bare
    ValueError; and the error named the largest id, not the bad one."""
    from specray.client.request import build_request

    with pytest.raises(InvalidArgumentError, match=f"prompt: .*got {shown}"):
        build_request(ids)


def test_a_cache_salt_and_messages_of_the_wrong_kind_are_refused_before_any_call():
    from specray.client.request import build_request

    with pytest.raises(InvalidArgumentError, match="^INVALID_ARGUMENT: cache_salt: a string"):
        build_request("hi", cache_salt=5)
    for messages in ("hi", {"role": "user", "content": "hi"}):  # a string's characters were its "messages"
        with pytest.raises(ValueError, match="messages must be a list"):
            build_request(messages=messages)
    assert build_request("hi", cache_salt="t").cache_salt == "t"
