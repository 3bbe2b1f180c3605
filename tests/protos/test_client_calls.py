"""The client SDK's calls without a server: a stream is one call (a second iteration or a collect()
after the loop ran the generation again), cancel() holds during a retry's wait, retry=None means
no retries, arguments are checked before any call, errors pickle."""

import pickle

import grpc
import pytest

from specray.client import Client, RetryPolicy
from specray.client._common import RECEIVE_UNLIMITED, Deadline, channel_options, credentials
from specray.client.errors import InvalidArgumentError, UnavailableError
from specray.client.sync import Stream
from specray.client.request import build_request
from specray.protos.specray.v1 import generate_pb2 as pb


class Unavailable(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "connection refused"


class FakeCall:
    """A streamed call's messages (or an error), as grpc's call object iterates them."""

    def __init__(self, messages, error=None):
        self.messages, self.error, self.cancelled = messages, error, False

    def __iter__(self):
        yield from self.messages
        if self.error is not None:
            raise self.error

    def cancel(self):
        self.cancelled = True


def messages():
    return [pb.GenerateResponse(request_id="r", delta=pb.ChoiceDelta(text="w1", token_ids=[5])),
            pb.GenerateResponse(request_id="r", delta=pb.ChoiceDelta(text=" w2", token_ids=[6])),
            pb.GenerateResponse(request_id="r", summary=pb.GenerateSummary(model="m"))]


def stream_of(calls: list, policy=RetryPolicy(max_attempts=3, initial_backoff=0.001, max_backoff=0.001)):
    started = []

    def start(timeout):
        started.append(timeout)
        return calls[len(started) - 1]

    return Stream(start, policy, Deadline(None), "m"), started


def test_a_stream_is_one_call_and_collect_after_the_loop_reuses_it():
    stream, started = stream_of([FakeCall(messages()), FakeCall(messages())])
    texts = [d.text for d in stream]
    whole = stream.collect()
    assert texts == ["w1", " w2"] and whole.choices[0].text == "w1 w2" and whole.choices[0].token_ids == [5, 6]
    assert len(started) == 1  # collect() ran the generation a second time
    with pytest.raises(RuntimeError, match="already iterated"):
        list(stream)
    fresh, started = stream_of([FakeCall(messages())])
    assert fresh.collect().choices[0].text == "w1 w2" and len(started) == 1


def test_collect_after_a_loop_left_early_says_so():
    stream, _ = stream_of([FakeCall(messages())])
    for _ in stream:
        break
    with pytest.raises(RuntimeError, match="left .* before its end"):
        stream.collect()


def test_cancel_during_a_retry_wait_starts_no_other_attempt(monkeypatch):
    stream, started = stream_of([FakeCall([], Unavailable()), FakeCall(messages())])
    monkeypatch.setattr("specray.client.sync.time.sleep", lambda s: stream.cancel())
    assert list(stream) == [] and len(started) == 1


def test_retry_none_is_no_retries_and_the_real_error_shows():
    with Client("localhost:1", retry=None, timeout=2) as c:
        assert c.retry.max_attempts == 1
        with pytest.raises(UnavailableError):  # was AttributeError: 'NoneType' object has no attribute 'backoff'
            c.generate("w1", max_tokens=2)
    with pytest.raises(ValueError, match="max_attempts must be an integer >= 1"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="timeout must be a number of seconds > 0"):
        Client("localhost:1", timeout="5")


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(prompt=b"hi"), InvalidArgumentError, "got bytes"),  # went out as token ids 104, 105
    (dict(prompt=["hello"]), InvalidArgumentError, "token ids are integers"),
    (dict(prompt=[2 ** 40]), InvalidArgumentError, "token ids are integers"),
    (dict(prompt=[]), InvalidArgumentError, "prompt: empty"),
    (dict(prompt="hi", stop_token_ids=5), InvalidArgumentError, "stop_token_ids: a list"),
    (dict(prompt="hi", temperature=True), InvalidArgumentError, "temperature: not a bool"),  # went out as 1.0
    (dict(prompt="hi", ignore_eos="no"), InvalidArgumentError, "ignore_eos: true or false"),
    (dict(prompt="hi", sampling={"max_tokens": 5}), TypeError, "sampling must be a Sampling"),
    (dict(prompt="hi", model=3), TypeError, "model must be a string"),
])
def test_bad_arguments_are_named_before_any_call(kwargs, error, message):
    with pytest.raises(error, match=message):
        build_request(**kwargs)


def test_errors_pickle_and_the_channel_takes_large_answers():
    err = pickle.loads(pickle.dumps(InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, "top_k: bad")))
    assert isinstance(err, InvalidArgumentError) and err.details == "top_k: bad" and str(err).endswith("top_k: bad")
    assert RECEIVE_UNLIMITED in channel_options(None, None)  # 4 MiB: long logprobs answers failed
    assert channel_options(None, [("grpc.max_receive_message_length", 1024)]).count(RECEIVE_UNLIMITED) == 0
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    assert credentials(False, pem) is not None  # the PEM text itself, not a file named after it


def test_an_async_client_made_outside_its_loop_works_and_a_second_loop_is_told():
    """Built before asyncio.run, its first call failed with grpc's "attached to a different loop";
    reused in a second loop, with "Event loop is closed"."""
    import asyncio

    from specray.client import AsyncClient

    client = AsyncClient("localhost:1", retry=None, timeout=2)
    with pytest.raises(UnavailableError):  # the server's absence, not the loop
        asyncio.run(client.health())
    with pytest.raises(RuntimeError, match="create an AsyncClient in each event loop"):
        asyncio.run(client.generate("w1", max_tokens=2))
