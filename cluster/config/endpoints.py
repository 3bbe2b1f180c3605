"""The two APIs' settings in the serving config (`http`, `grpc`): where they listen, the API key,
limits and TLS."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from specray.cluster.config.defaults import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_REQUEST_BYTES
from specray.cluster.config.pools import Strict


class HttpConfig(Strict):
    # replica: specray's own HTTP server in the Serve replica (no proxy hop; request heads must arrive
    # within header_timeout_s and stay under 64 KiB); proxy: Ray Serve's HTTP proxy, which runs on every
    # node but bounds neither (the Helm chart's choice: put a reverse proxy with those limits in front)
    server: Literal["replica", "proxy"] = "replica"
    host: str = Field("127.0.0.1", min_length=1,
                      description="interface to listen on; 0.0.0.0 exposes the server to the network")
    port: int = Field(8000, ge=1, le=65535)
    api_key: str | None = Field(None, description="require 'Authorization: Bearer <key>' on every route but "
                                "/health and /metrics; prefer api_key_file or the variable (argv is public)")
    api_key_file: str | None = Field(None, description="read the API key from this file (first line)")
    api_key_env: str | None = Field("SPECRAY_API_KEY", description="read the API key from this variable")
    default_max_tokens: int = Field(256, ge=1)
    max_request_bytes: int = Field(DEFAULT_MAX_REQUEST_BYTES, ge=1024, description="larger bodies get 413")
    keep_alive_timeout_s: float = Field(5.0, gt=0, description="idle connections close after this")
    header_timeout_s: float = Field(10.0, gt=0, description="replica server: a request head must arrive within this")
    body_timeout_s: float = Field(DEFAULT_BODY_TIMEOUT_S, gt=0, description="a request body must arrive whole within this of "
                                  "its head (408): raise it with max_request_bytes for slow links")

    @model_validator(mode="after")
    def _one_key(self) -> "HttpConfig":
        if self.api_key is not None and not self.api_key.strip():  # `--api-key "$KEY"` with KEY unset
            raise ValueError("http.api_key is empty, which would serve without a key: give a key or leave it out")
        if self.api_key and self.api_key_file:
            raise ValueError("http.api_key and http.api_key_file are two keys: give one")
        return self

    def resolved_api_key(self) -> str | None:
        """The key both APIs require: `api_key`, else `api_key_file`'s, else the `api_key_env`
        variable's; None: no key."""
        if self.api_key:
            return self.api_key
        if self.api_key_file:
            try:
                key = Path(self.api_key_file).read_text(encoding="utf-8").strip()
            except OSError as e:
                raise ValueError(f"http.api_key_file: cannot read {self.api_key_file}: {e.strerror}") from None
            except UnicodeDecodeError:
                raise ValueError(f"http.api_key_file: {self.api_key_file} is not UTF-8 text") from None
            if not key:
                raise ValueError(f"http.api_key_file: {self.api_key_file} is empty")
            if "\n" in key:  # the key would hold a newline, and every request would be a 401
                raise ValueError(f"http.api_key_file: {self.api_key_file} holds more than one line; the key alone")
            return key
        # stripped as the file's is: a Kubernetes Secret made --from-file ends in a newline
        return (os.environ.get(self.api_key_env, "").strip() if self.api_key_env else None) or None


MAX_GRPC_S = 2_147_483  # grpc takes these in int32 milliseconds


class GrpcConfig(Strict):
    port: int = Field(9000, ge=1, le=65535)
    enabled: bool = True
    # replica: specray's own grpc.aio server in the Serve replica (binds `host`, TLS, message limit,
    # malformed messages are INVALID_ARGUMENT); proxy: Ray Serve's gRPC proxy, which runs on every
    # node but binds all interfaces, has no TLS and takes messages up to 2 GiB (the Helm chart's choice)
    server: Literal["replica", "proxy"] = "replica"
    host: str | None = Field(None, min_length=1, description="interface to listen on (replica server); unset: http.host")
    max_message_bytes: int = Field(DEFAULT_MAX_REQUEST_BYTES, ge=1024,
                                   description="larger request messages get RESOURCE_EXHAUSTED (replica server)")
    max_concurrent_streams: int = Field(1000, ge=1, description="calls one connection may have open at once; more "
                                        "wait in the client (replica server)")
    keepalive_time_s: float = Field(60.0, gt=0, le=MAX_GRPC_S, description="ping a connection with calls open after this long "
                                    "without a frame from it (replica server)")
    keepalive_timeout_s: float = Field(20.0, gt=0, le=MAX_GRPC_S, description="a connection whose ping goes unanswered this long "
                                       "is closed and its calls cancelled: a vanished client frees its sequences")
    idle_timeout_s: float = Field(300.0, gt=0, le=MAX_GRPC_S, description="close a connection without calls for this long "
                                  "(replica server; clients reconnect)")
    tls_cert_file: str | None = Field(None, description="PEM certificate chain: serve gRPC over TLS")
    tls_key_file: str | None = Field(None, description="PEM private key of tls_cert_file")

    @model_validator(mode="after")
    def _tls(self) -> "GrpcConfig":
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        if self.tls_cert_file and self.server == "proxy":
            raise ValueError("Ray Serve's gRPC proxy has no TLS: use server 'replica', or terminate TLS in front")
        return self

    def tls_pair(self) -> tuple[bytes, bytes] | None:
        """(private key, certificate chain) PEM bytes, or None: plaintext."""
        if not self.tls_cert_file:
            return None
        try:
            pair = Path(self.tls_key_file).read_bytes(), Path(self.tls_cert_file).read_bytes()
        except OSError as e:
            raise ValueError(f"grpc TLS: cannot read {e.filename}: {e.strerror}") from None
        check_tls_pair(self.tls_cert_file, self.tls_key_file)
        return pair


def check_tls_pair(cert_file: str, key_file: str) -> None:
    """A certificate chain and its private key that load together (gRPC says only "Failed to bind to
    address" for a key that does not match)."""
    import ssl

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_file, key_file)
    except (ssl.SSLError, ValueError) as e:
        raise ValueError(f"grpc TLS: {cert_file} and {key_file} are not a certificate chain and its private key "
                         f"({e})") from None
