"""`specray serve`'s API key: never printed, read from a file or the environment, and resolved where
serve runs so that replicas on a joined cluster get the key itself; TLS files go in pairs."""

import pytest

from specray.cluster.cli import main


def test_dry_run_hides_the_api_key_and_checks_tls_files(tmp_path, capsys):
    import yaml

    assert main(["serve", "--api-key", "sk-secret", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "sk-secret" not in out and yaml.safe_load(out)["http"]["api_key"] == "<hidden>"
    assert yaml.safe_load(out)["http"]["host"] == "127.0.0.1"
    assert main(["serve", "--grpc-tls-cert", str(tmp_path / "c.pem"), "--dry-run"]) == 2
    assert "tls_cert_file and tls_key_file go together" in capsys.readouterr().err


def test_api_key_sources(tmp_path, monkeypatch):
    from specray.cluster.config.endpoints import HttpConfig

    key = tmp_path / "key"
    key.write_text("sk-a\n")
    monkeypatch.setenv("SPECRAY_API_KEY", "sk-env")
    assert HttpConfig(api_key_file=str(key)).resolved_api_key() == "sk-a"
    assert HttpConfig().resolved_api_key() == "sk-env"
    monkeypatch.setenv("SPECRAY_API_KEY", "sk-env\n")  # a Secret made --from-file: stripped as a file's is
    assert HttpConfig().resolved_api_key() == "sk-env"
    with pytest.raises(ValueError, match="cannot read"):
        HttpConfig(api_key_file=str(tmp_path / "missing")).resolved_api_key()


def test_the_replicas_get_the_key_resolved_where_serve_runs(tmp_path, monkeypatch):
    """A replica on a joined cluster sees neither this shell's variable nor this machine's key file:
    the config it gets carries the key itself."""
    from specray.cluster.config.serve import ServeConfig
    from specray.cluster.serve.run import for_replicas

    monkeypatch.setenv("SPECRAY_API_KEY", "sk-env")
    shipped = for_replicas(ServeConfig())
    monkeypatch.delenv("SPECRAY_API_KEY")  # the replica's environment
    assert ServeConfig.model_validate(shipped.model_dump()).http.resolved_api_key() == "sk-env"
    key = tmp_path / "key"
    key.write_text("sk-file\n")
    shipped = for_replicas(ServeConfig.from_dict({"http": {"api_key_file": str(key)}}))
    key.unlink()
    assert shipped.http.api_key_file is None and shipped.http.resolved_api_key() == "sk-file"
    assert for_replicas(ServeConfig()).http.api_key is None  # no key anywhere: none required


def test_the_banner_example_says_where_the_key_comes_from(tmp_path):
    """The printed curl works when pasted: the variable only where the key is the variable's, the
    file's contents for a key file, and never the key itself."""
    from specray.cluster.config.serve import ServeConfig
    from specray.cluster.serve.banner import endpoint_banner

    def auth_line(http: dict) -> str:
        banner = endpoint_banner(ServeConfig.from_dict({"http": http}), {"api_key": True})
        return next(line for line in banner.splitlines() if "Authorization" in line)

    assert "Bearer $SPECRAY_API_KEY" in auth_line({})
    assert "Bearer $MY_KEY" in auth_line({"api_key_env": "MY_KEY"})
    assert f"Bearer $(cat {tmp_path / 'k'})" in auth_line({"api_key_file": str(tmp_path / "k")})
    line = auth_line({"api_key": "sk-secret"})
    assert "sk-secret" not in line and "$SPECRAY_API_KEY" not in line and "--api-key" in line


def test_a_fractional_keep_alive_reaches_serves_proxy_in_whole_seconds():
    """Serve's HTTPOptions takes an integer: keep_alive_timeout_s 5.5 failed `specray serve` at start."""
    from ray.serve.config import HTTPOptions

    from specray.cluster.config.endpoints import HttpConfig
    from specray.cluster.serve.run import proxy_keep_alive

    assert HTTPOptions(keep_alive_timeout_s=proxy_keep_alive(HttpConfig(keep_alive_timeout_s=5.5))).keep_alive_timeout_s == 6
    assert proxy_keep_alive(HttpConfig(keep_alive_timeout_s=0.2)) == 1


def test_the_body_deadline_is_the_configs():
    """Fixed at 60 s, a larger max_request_bytes over a slow link got 408s nothing could lift."""
    from specray.cluster.serve.middleware import RequestLimits
    from specray.cluster.serve.openai_api import OpenAIServer

    class Router:
        class router:
            class config:
                max_model_len, block_length = 64, 1

    class Tokenizer:
        def get_vocab(self):
            return {"a": 0}

    app = OpenAIServer(Router(), Tokenizer(), "m", body_timeout_s=123.0).app
    limits = [m.kwargs for m in app.user_middleware if m.cls is RequestLimits]
    assert limits and limits[0]["body_timeout_s"] == 123.0


@pytest.mark.parametrize("http, words", [({"api_key": ""}, "empty"), ({"api_key": "  "}, "empty"),
                                         ({"api_key": "a", "api_key_file": "/k"}, "two keys")])
def test_an_empty_key_or_two_keys_are_refused(http, words):
    """`--api-key "$KEY"` with KEY unset served without a key, silently; a key and a key file, the
    inline one won."""
    from specray.cluster.config.serve import ServeConfig

    with pytest.raises(ValueError, match=words):
        ServeConfig.from_dict({"http": http})
