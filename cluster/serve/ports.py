"""The addresses `specray serve` will listen on and the drafter it will talk to, tried before Ray
starts: a taken port or a host this machine cannot bind failed inside the replica, after three
deployment attempts and pages of tracebacks; a drafter at a wrong address held the replica minutes
and was retried forever."""

from __future__ import annotations

import errno
import socket

DRAFTER_WAIT_S = 10.0  # a running drafter answers a ping at once


def listen_addresses(cfg) -> list[tuple[str, str, int]]:
    """(what, host, port) of each listener this node opens: HTTP, the draft link's rendezvous where
    its port is set, and gRPC where enabled (Serve's gRPC proxy listens on every interface)."""
    out = [("HTTP", cfg.http.host, cfg.http.port)]
    if cfg.transport.master_port and cfg.draft_transport == "torch_distributed":  # the router hosts it
        out.append(("torch_distributed rendezvous", "0.0.0.0", cfg.transport.master_port))
    if cfg.grpc.enabled:
        host = (cfg.grpc.host or cfg.http.host) if cfg.grpc.server == "replica" else "0.0.0.0"
        out.append(("gRPC", host, cfg.grpc.port))
    return out


def check_bindable(what: str, host: str, port: int) -> None:
    """ValueError saying why `host:port` cannot be listened on here; nothing stays bound."""
    where = f"{what} on {host}:{port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError):
        raise ValueError(f"{where}: {host!r} is not a host name or address this machine can resolve") from None
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers set it: TIME_WAIT is no clash
        try:
            s.bind(address)
        except OSError as e:
            why = {errno.EADDRINUSE: "the port is in use (another server?)",
                   errno.EADDRNOTAVAIL: "not an address of this machine",
                   errno.EACCES: "permission denied (ports below 1024 need privileges)"}.get(e.errno, e.strerror)
            raise ValueError(f"{where}: cannot listen: {why}") from None


def check_listening(cfg) -> None:
    for what, host, port in listen_addresses(cfg):
        check_bindable(what, host, port)


def check_drafter(cfg) -> None:
    """An external drafter (transport grpc) must answer, serving the method asked for: one line
    before Ray starts, not a replica waiting minutes and retried forever."""
    if cfg.draft_transport != "grpc" or cfg.speculative is None:
        return
    from specray.cluster.pools.grpc_transport import GrpcDraftPool

    from specray.cluster.pools.build import target_vocab

    pool = GrpcDraftPool(cfg.transport.drafter_address, method=cfg.speculative.method, vocab_size=target_vocab(cfg))
    try:
        pool.ready(timeout_s=DRAFTER_WAIT_S)
    finally:
        pool.close()
