"""How a Ray pool calls its lone worker each round: over a same-node channel
(cluster/pools/local_channel.py) where allowed and the worker is on this process's node, else Ray
actor calls."""

from __future__ import annotations

import ray

from specray.cluster.pools.local_channel import Channel, ChannelClosed, ChannelPending


def open_channel(actor) -> Channel | None:
    """A channel to `actor`'s worker where it runs on this process's node (None elsewhere)."""
    if ray.get(actor.node_id.remote()) != ray.get_runtime_context().get_node_id():
        return None
    address = ray.get(actor.open_channel.remote())
    return None if address is None else Channel(*address)


class WorkerCalls:
    """A pool's calls to its lone worker: over a same-node channel where `use_channel` allows and the
    worker is on this node, else Ray actor calls. Opened at the first call after each (re)start."""

    def __init__(self, use_channel: bool):
        self.use_channel, self.channel, self.tried = use_channel, None, False

    def get(self, actor) -> Channel | None:
        if self.use_channel and not self.tried:
            self.tried = True
            self.channel = open_channel(actor)
        return self.channel

    def reset(self) -> None:
        if self.channel is not None:
            self.channel.close()
        self.channel, self.tried = None, False

    def submit(self, actor, method: str, *args, on_failure, timeout_s: float | None = None,
               on_result=None) -> ChannelPending | None:
        """The call sent over the channel, its reply pending; None where Ray carries calls. A
        channel found closed fails the call as a lost reply would (`on_failure`)."""
        channel = self.get(actor)
        if channel is None:
            return None
        try:
            ticket = channel.send(method, *args)
        except ChannelClosed as e:
            raise on_failure(e) from None
        return ChannelPending(channel, ticket, on_failure, timeout_s, on_result)

    def send_no_reply(self, actor, method: str, *args) -> None:
        """Fire and forget, ordered after the calls sent before it; a closed channel drops it (the
        worker, and the state it would free, are gone)."""
        channel = self.get(actor)
        if channel is None:
            actor.call.remote(method, *args)
            return
        try:
            channel.send(method, *args, reply=False)
        except ChannelClosed:
            pass

    def call(self, actor, method: str, *args):
        channel = self.get(actor)
        return ray.get(actor.call.remote(method, *args)) if channel is None else channel.call(method, *args)
