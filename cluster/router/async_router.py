"""AsyncRouter: runs the Router's rounds on the process's compute thread and streams each request's
outputs to asyncio consumers. The Router itself is single-threaded; every mutation (add, abort)
is queued and applied between rounds.

Each round is one turn, a task that queues the next while work remains. The serving runtime posts
the turns to the process's compute thread (cluster/pools/compute_thread.py): workers in this
process (`pools.colocate`, the inline draft) are then called directly from the round, as the
in-process engine calls them, instead of through two thread hand-offs a call (docs/performance.md
has the served rounds before and after). Without a `post`, the turns get a thread of their own."""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from specray.cluster.outputs import RequestOutput
from specray.cluster.params import SamplingParamError, SamplingParams
from specray.cluster.pools.api import TargetUnavailable
from specray.cluster.router.failures import request_failed
from specray.cluster.router.router import Router


class QueueFullError(RuntimeError):
    """More requests are waiting than the server accepts (HTTP 429, gRPC RESOURCE_EXHAUSTED)."""


class RouterStopped(RuntimeError):
    """The router takes no more turns: it is shutting down, or broke and its replica restarts
    (HTTP 503, gRPC UNAVAILABLE: another replica, or this one restarted, can take the retry)."""


@dataclass(frozen=True)
class Add:
    """Queue a request on the router (from the caller's event loop to the rounds' thread)."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    prompt: str | None


@dataclass(frozen=True)
class Abort:
    """Free a request's sequences: its consumer went away or was cancelled."""

    request_id: str


Command = Add | Abort


class Snapshots(asyncio.Queue):
    """A request's stream. Outputs are cumulative snapshots, so an output replaces an unfinished one
    still queued: a consumer that fell behind gets one chunk, not one a round, and one that stopped
    reading holds one output, not every round's (memory grew with rounds x length until the client
    left). Failures are never replaced, and end the stream."""

    def _put(self, item) -> None:
        queued = self._queue[-1] if self._queue else None
        if isinstance(item, RequestOutput) and isinstance(queued, RequestOutput) and not queued.finished:
            self._queue[-1] = item
        else:
            self._queue.append(item)


def _put_all(puts: list[tuple[asyncio.Queue, object]]) -> None:
    for stream, item in puts:
        stream.put_nowait(item)


class AsyncRouter:
    def __init__(self, router: Router, max_waiting: int = 256, post: Callable[[Callable], Future] | None = None,
                 waiting: Callable[[], bool] | None = None):
        """`post(fn)` runs fn on the thread that is to run the rounds and returns its Future;
        `waiting()` says whether other work waits for that thread (a turn then ends after its round)."""
        self.router = router
        self._own = None if post is not None else ThreadPoolExecutor(1, thread_name_prefix="specray-router")
        self._post = post or self._own.submit
        self._waiting = waiting or (lambda: False)
        self.max_waiting = max_waiting
        self._commands: queue.Queue = queue.Queue()
        self._queued_seqs = 0  # sequences of Add commands no turn has taken yet
        # guards _queued_seqs: callers on several event loops (HTTP, gRPC) share the bound, and the
        # turns take from it
        self._admission = threading.Lock()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._ids = itertools.count()
        # request ids unique across routers: a drafter shared by replicas, or outliving a server,
        # keys its sequences by them
        self._id_prefix = uuid.uuid4().hex[:8]
        self._turn_queued = False  # a turn waits on the compute thread (guarded by _turns)
        self._turns = threading.Lock()
        self._stopped = False
        self._broken: BaseException | None = None  # what ended the turns, if not shutdown
        self._turning: threading.Thread | None = None  # the thread inside a turn
        self._held: list[tuple[str, object]] = []  # the last round's outputs, until the next round is sent
        # a pipeline slot returns after sending the next steps, and a diffusion router has no hook:
        # their outputs go out at once
        self._hold = isinstance(router, Router) and router.pipeline is None
        if self._hold:
            router.after_submit = self._flush

    @property
    def num_waiting(self) -> int:
        """Sequences waiting for a place in the running batch (a request with n choices counts n)."""
        return len(self.router.waiting) + self._queued_seqs

    def _free_places(self) -> int:
        """Places the running batch has free (read off the rounds' thread: a round may take one meanwhile)."""
        return max(0, self.router.config.max_num_seqs - len(self.router.running))

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams,
                       prompt: str | None = None) -> AsyncIterator[RequestOutput]:
        """Yield the request's output after every round until it finishes. Raises ValueError for
        bad input and QueueFullError when the queue is full; cancelling the consumer aborts it."""
        if self._broken is not None:
            raise RouterStopped("the router stopped after an internal error; the replica restarts") from self._broken
        if self._stopped:  # no turn would run it
            raise RouterStopped("the router is shutting down; retry")
        self.router.check_prompt(prompt_token_ids, params)
        self.check_size(params.n)
        request_id = f"req-{self._id_prefix}-{next(self._ids)}"
        stream = Snapshots()
        with self._admission:  # shutdown and a broken turn fail the streams they find under this lock
            if self._stopped:
                raise RouterStopped("the router is shutting down; retry")
            if self._broken is not None:
                raise RouterStopped("the router stopped after an internal error; the replica restarts") from self._broken
            queued = self.num_waiting - self._free_places()  # a burst into an idle batch takes its places first
            if queued + params.n > self.max_waiting:
                raise QueueFullError(f"{queued} sequences are already waiting for a place in the running batch "
                                     f"(at most {self.max_waiting}); retry later")
            self._streams[request_id] = (asyncio.get_running_loop(), stream)
            self._queued_seqs += params.n
        finished = False
        try:
            self._submit(Add(request_id, prompt_token_ids, params, prompt))
            while not finished:
                item = await stream.get()
                if isinstance(item, Exception):
                    raise item
                finished = item.finished
                yield item
        finally:
            self._streams.pop(request_id, None)
            if not finished:  # the client went away or the consumer was cancelled: free the sequence
                self._submit(Abort(request_id))

    def check_size(self, num_seqs: int, what: str | None = None, param: str = "n") -> None:
        """A request of `num_seqs` sequences that the queue could never hold is the request's fault
        (a 400, not a full queue's retryable 429); `what` says how they add up, `param` names the field."""
        if num_seqs > self.max_waiting:
            raise SamplingParamError(param, f"{what or f'n={num_seqs}'}: {num_seqs} sequences exceed the server's "
                                            f"queue of {self.max_waiting}")

    @property
    def alive(self) -> bool:
        return not self._stopped and self._broken is None

    def shutdown(self, timeout: float = 10) -> None:
        """Stop taking turns; returns once a turn under way has ended (or after `timeout` seconds)."""
        if self._stopped:
            return
        self._stopped = True
        if self._turning is threading.current_thread():
            self._end_all()
        else:
            try:
                self._post(self._end_all).result(timeout=timeout)
            except (TimeoutError, FutureTimeout):  # the same class from Python 3.11 on, not on 3.10
                pass
        with self._admission:  # no turn runs what still waits for one: it fails, retryably
            streams = list(self._streams)
        self._deliver_all([(request_id, RouterStopped("the router shut down before this request finished; retry"))
                           for request_id in streams])
        if self._own is not None:
            self._own.shutdown(wait=False)

    # -- the turns --------------------------------------------------------------------------
    def _submit(self, command: Command) -> None:
        self._commands.put(command)
        self._queue_turn()

    def _queue_turn(self) -> None:
        with self._turns:
            if self._turn_queued or self._stopped or self._broken is not None:  # no turn on a broken router
                return
            self._turn_queued = True
        self._post(self._turn)

    def _apply_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, Add):
                try:
                    self.router.add_request(command.prompt_token_ids, command.params, command.prompt,
                                            request_id=command.request_id)
                except ValueError as e:
                    self._deliver(command.request_id, e)
                except Exception as e:  # noqa: BLE001 - a router bug on one request fails that request only
                    self.router.abort(command.request_id)
                    self._deliver(command.request_id, request_failed(command.request_id, e))
                finally:  # after the add: the count never dips below what waits
                    with self._admission:
                        self._queued_seqs -= command.params.n
            else:
                self.router.abort(command.request_id)

    def _turn(self) -> None:
        """Commands and a round, again while work remains and nothing else waits for the thread,
        then the next turn. A round's outputs are held until the next round's target step is sent
        (Router.after_submit): the event loops then stream them while the target computes, and the
        next round's calls do not wait for the GIL behind them. Held outputs go out before anything
        else is delivered, and at once when no round follows. Rounds in one turn skip the thread's
        wake-up between them (a self-pipe write, a select and the GIL taken back each)."""
        with self._turns:
            self._turn_queued = False  # a command from now on queues another turn
        if self._stopped:
            return
        self._turning = threading.current_thread()
        try:
            while True:
                self._apply_commands()
                if not self.router.has_unfinished():
                    break
                self._round()
                if self._stopped or self._waiting():
                    break
            if self.router.has_unfinished() and not self._stopped:
                self._queue_turn()
            else:
                self._flush()
        except BaseException as e:  # noqa: BLE001 - the health check reports it; Serve restarts us
            with self._admission:  # a request admitted from now on is refused: no turn would run it
                self._broken = e
                streams = list(self._streams)
            for request_id in streams:  # no request waits on turns that stopped
                self._deliver(request_id, request_failed(request_id, e))
            raise
        finally:
            self._turning = None

    def _round(self) -> None:
        outputs = []
        try:
            outputs = self.router.step()
        except TargetUnavailable as e:  # KV lost: fail (retryably) what ran; the pool restarts
            for request_id in self.router.fail_all():
                self._deliver(request_id, e)
        except Exception as e:  # noqa: BLE001 - a router bug fails what ran, never the server
            self._fail_running(e)
        self._flush()  # a round that sent no target step (or failed) leaves them here
        self._held = [(out.request_id, out) for out in outputs] + self.router.take_failures()
        if not self._hold:
            self._flush()

    def _end_all(self) -> None:
        """At shutdown: the held outputs go out, and every request still in the router is aborted, so
        the pools release its sequences (a drafter that outlives this server would keep their state)."""
        self._flush()
        for request_id in list(self.router.requests):
            self.router.abort(request_id)

    def _flush(self) -> None:
        held, self._held = self._held, []
        if held:
            self._deliver_all(held)

    def _fail_running(self, error: Exception) -> None:
        for request_id in list(self.router.requests):
            self.router.abort(request_id)
            self._deliver(request_id, request_failed(request_id, error))

    def _deliver(self, request_id: str, item) -> None:
        self._flush()  # in order: a request's held output before its failure
        self._deliver_all([(request_id, item)])

    def _deliver_all(self, items: list[tuple[str, object]]) -> None:
        """A round's outputs (and failures), in order: one wake-up per event loop, not one per
        request (each costs the loop a self-pipe write and the rounds' thread a GIL hand-off)."""
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for request_id, item in items:
            target = self._streams.get(request_id)
            if target is not None:
                by_loop.setdefault(target[0], []).append((target[1], item))
        for loop, puts in by_loop.items():
            try:  # a caller's loop that ended (at shutdown) takes nothing more: the others' still go out
                loop.call_soon_threadsafe(_put_all, puts)
            except RuntimeError:  # closed, also between a check and the call
                continue
