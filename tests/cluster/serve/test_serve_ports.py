"""The addresses `specray serve` listens on, tried before Ray starts: a taken port or a host this
machine cannot bind is one line, and no gRPC port is ever shared by two servers."""

import pytest

from specray.cluster.cli import main
from specray.cluster.serve.http_server import free_port


def test_an_address_it_cannot_listen_on_exits_2_before_ray_starts(capsys, monkeypatch, tiny_target):
    """A taken port (HTTP or gRPC) and a host this machine cannot bind failed inside the replica after
    three deployment attempts (about 50 s, pages of tracebacks); a second server on a taken gRPC port
    shared it (gRPC's SO_REUSEPORT), splitting clients between two servers."""
    import socket

    import specray.cluster.serve.local_ray as local_ray

    monkeypatch.setattr(local_ray, "start_ray", lambda cfg: pytest.fail("Ray must not start"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        model = ["--model", str(tiny_target)]
        assert main(["serve", *model, "--port", str(port), "--grpc-port", str(free_port())]) == 2
        assert f"HTTP on 127.0.0.1:{port}: cannot listen: the port is in use" in capsys.readouterr().err
        assert main(["serve", *model, "--port", str(free_port()), "--grpc-port", str(port)]) == 2
        assert f"gRPC on 127.0.0.1:{port}: cannot listen: the port is in use" in capsys.readouterr().err
    assert main(["serve", *model, "--host", "not a host!!"]) == 2
    assert "is not a host name or address this machine can resolve" in capsys.readouterr().err


def test_a_grpc_port_is_not_shared_by_two_servers():
    import asyncio

    from specray.cluster.serve.grpc_server import serve_grpc
    from specray.cluster.serve.grpc_service import GenerationService

    async def two() -> None:
        port = free_port()
        first = await serve_grpc(GenerationService(None, None, "m"), port)
        try:
            with pytest.raises(RuntimeError):
                await serve_grpc(GenerationService(None, None, "m"), port)
        finally:
            await first.stop(0)
    asyncio.run(two())
