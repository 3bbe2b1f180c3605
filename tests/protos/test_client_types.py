"""The client SDK's Sampling -> wire message: a value the message cannot hold fails before any call."""

import pytest

from specray.client import Sampling
from specray.client.errors import InvalidArgumentError


@pytest.mark.parametrize("field, value", [("seed", -1), ("seed", 2**64), ("top_k", 2**40), ("temperature", "hot")])
def test_a_value_the_message_cannot_hold_is_an_invalid_argument_naming_its_field(field, value):
    with pytest.raises(InvalidArgumentError, match=f"^INVALID_ARGUMENT: {field}: "):
        Sampling(**{field: value}).to_proto()


def test_set_values_go_through_and_unset_ones_stay_unset():
    msg = Sampling(seed=3, stop="x", stop_token_ids=[7]).to_proto()
    assert msg.seed == 3 and list(msg.stop) == ["x"] and list(msg.stop_token_ids) == [7]
    assert not msg.HasField("max_tokens") and not msg.HasField("temperature")
