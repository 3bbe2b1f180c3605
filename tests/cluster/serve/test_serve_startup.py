"""`specray serve`'s start: what would fail inside the replica (or on a cluster it joins) is said in
one line before Ray starts, and a deployment that fails anyway ends the command with that reason,
not Serve's whole traceback."""

import shutil
import subprocess

import pytest

from specray.cluster.cli import main
from specray.cluster.config.serve import ServeConfig
from specray.cluster.serve.http_server import free_port


def ports() -> list[str]:
    return ["--port", str(free_port()), "--grpc-port", str(free_port())]


@pytest.fixture()
def no_ray(monkeypatch):
    import specray.cluster.serve.local_ray as local_ray

    monkeypatch.setattr(local_ray, "start_ray", lambda cfg: pytest.fail("Ray must not start"))


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI to make test certificates")
def test_a_key_that_is_not_the_certificates_exits_2_before_ray(tmp_path, capsys, no_ray, tiny_target):
    """gRPC said only "Failed to bind to address", inside the replica, three times."""
    for name in ("a", "b"):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=x",
                        "-keyout", str(tmp_path / f"{name}.key"), "-out", str(tmp_path / f"{name}.pem")],
                       check=True, capture_output=True)
    argv = ["serve", "--model", str(tiny_target), *ports(), "--grpc-tls-cert", str(tmp_path / "a.pem")]
    assert main([*argv, "--grpc-tls-key", str(tmp_path / "b.key")]) == 2
    assert "are not a certificate chain and its private key" in capsys.readouterr().err
    assert main([*argv, "--grpc-tls-key", str(tmp_path / "missing.key")]) == 2
    assert "grpc TLS: cannot read" in capsys.readouterr().err


@pytest.mark.parametrize("content, message", [(b"sk-one\n# rotated: sk-old\n", "holds more than one line"),
                                              (b"\xff\xfe\x00", "is not UTF-8 text")])
def test_a_key_file_that_is_not_one_key_exits_2(tmp_path, capsys, no_ray, content, message):
    """Two lines made a key with a newline in it: every request was a 401."""
    (tmp_path / "key").write_bytes(content)
    assert main(["serve", "--api-key-file", str(tmp_path / "key"), *ports()]) == 2
    assert message in capsys.readouterr().err


def test_a_deployment_that_fails_ends_with_its_reason(monkeypatch, capsys, tiny_target):
    import specray.cluster.serve.local_ray as local_ray
    import specray.cluster.serve.run as run

    def failing(cfg):
        raise RuntimeError("Deploying app 'specray' failed:\nTraceback (most recent call last):\n  ...\n"
                           "ValueError: the replica could not load its draft")

    monkeypatch.setattr(local_ray, "start_ray", lambda cfg: None)
    monkeypatch.setattr(run, "run_serve", failing)
    assert main(["serve", "--model", str(tiny_target), *ports()]) == 1
    err = capsys.readouterr().err
    assert "the deployment failed: ValueError: the replica could not load its draft" in err and "Traceback" not in err


def test_an_address_where_no_cluster_answers_is_one_line(monkeypatch):
    import ray

    from specray.cluster.serve.local_ray import start_ray

    def refused(**kwargs):
        raise ConnectionError("Could not find any running Ray instance")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refused)
    with pytest.raises(ValueError, match="--address auto: no Ray cluster answers there"):
        start_ray(ServeConfig.from_dict({"ray_address": "auto"}))


def test_an_ipv6_host_is_bracketed_in_the_banner():
    from specray.cluster.serve.banner import endpoint_banner

    text = endpoint_banner(ServeConfig.from_dict({"http": {"host": "::1"}, "grpc": {"host": "::1"}}), {"grpc": True})
    assert "http://[::1]:8000/v1" in text and "[::1]:9000" in text
