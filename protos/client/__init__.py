"""specray's Python client SDK: `Client` (blocking) and `AsyncClient` (asyncio) over the
`specray.v1.Generation` gRPC API. Needs only grpcio and protobuf (never torch or ray).

    from specray.client import Client
    with Client("localhost:9000") as client:
        print(client.generate("Hello", max_tokens=16, temperature=0).text)
        for delta in client.stream("Hello", max_tokens=16):
            print(delta.text, end="")
"""

from specray.client._common import RetryPolicy
from specray.client.aio import AsyncClient, AsyncStream
from specray.client.errors import (CallCancelledError, DeadlineExceededError, InvalidArgumentError, NotFoundError,
                                   ResourceExhaustedError, SpecrayError, UnauthenticatedError, UnavailableError)
from specray.client.sync import Client, Stream
from specray.client.request import Sampling
from specray.client.types import (Choice, Completion, Delta, Model, SpeculativeMetrics, StreamSummary, TokenLogprob,
                                  TopLogprob, Usage)

__all__ = [
    "Client", "AsyncClient", "Stream", "AsyncStream", "RetryPolicy", "Sampling",
    "Completion", "Choice", "Delta", "StreamSummary", "Usage", "SpeculativeMetrics", "TokenLogprob", "TopLogprob",
    "Model", "SpecrayError", "InvalidArgumentError", "NotFoundError", "UnauthenticatedError",
    "ResourceExhaustedError", "UnavailableError", "DeadlineExceededError", "CallCancelledError",
]
