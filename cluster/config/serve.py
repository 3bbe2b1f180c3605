"""The one user-facing serving config: YAML file, CLI flags, the Helm chart's serveConfigV2 args.

Pydantic models with unknown keys rejected; `ServeConfig.from_yaml` / `from_dict` raise ValueError
with every problem listed. The pools read their Ray resources from `pools.draft.resources` and
`pools.target.resources`; the Helm chart writes the same keys, and a test checks they agree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from specray.cluster.config.defaults import default_speculative_config, is_default_for_other
from specray.cluster.config.endpoints import GrpcConfig, HttpConfig
from specray.cluster.config.pools import PoolsConfig, Strict
from specray.cluster.config.speculative import SpeculativeConfig
from specray.kernels.drafters import registry
from specray.kernels.kernel_modes import FAST_PARTS

TRANSPORTS = ("auto", "ray", "torch_distributed", "grpc", "inline")


class RouterConfig(Strict):
    pipelined: bool | Literal["auto"] = Field(
        "auto", description="two groups in flight: draft B while verifying A; auto: only when the draft is a model")
    max_num_seqs: int = Field(32, ge=1, description="running sequences at most")
    max_prefill_tokens: Annotated[int, Field(ge=1)] | Literal["auto"] | None = Field(
        "auto", description="prompt tokens a round prefills at most, a longer prompt in chunks over several "
        "rounds (chunked prefill): a first token waits only for the prompts ahead of it, and running "
        "sequences keep decoding beside a long prompt; auto: 256 on CPU (64 while other sequences decode), 512 on "
        "an accelerator; null: every prompt that fits, whole")
    max_waiting: int = Field(256, ge=1, description="sequences waiting beyond the running batch's free places "
                             "before 429 / RESOURCE_EXHAUSTED")
    kv_cache_tokens: int = Field(16384, ge=16, description="target KV cache size in tokens")
    block_size: int = Field(16, ge=1)
    enable_prefix_caching: bool = Field(True, description="automatic prefix caching: a prompt's full KV blocks "
                                        "that an earlier request computed are taken, not computed again (outputs "
                                        "unchanged: a token's KV does not depend on the step that computed it)")
    max_model_len: int | None = Field(None, ge=2, description="a sequence's context at most; unset: the model's, "
                                      "cut to what kv_cache_tokens holds (a set one it cannot hold is refused)")
    draft_timeout_s: float = Field(60.0, gt=0, description="a slower draft pool counts as lost")
    target_timeout_s: float = Field(120.0, gt=0, description="a target step slower than this counts as a lost "
                                    "worker (hung, or its node gone): its requests fail (503) and the pool "
                                    "restarts; Ray actor pools only")

    @field_validator("max_prefill_tokens", mode="before")
    @classmethod
    def _prefill_tokens(cls, value: Any) -> Any:
        """One message for every wrong value (the union's own errors name its members instead)."""
        if value is None or value == "auto" or (type(value) is int and value >= 1):
            return value
        raise ValueError(f"must be a positive integer, 'auto' or null, got {value!r}")


class TransportConfig(Strict):
    # inline: the draft worker runs in the router's process (no hop a round; for n-gram and ADED,
    # whose drafting is cheap CPU work, or a small draft on a router with cores to spare); auto:
    # inline for a method without a draft model, ray for one with
    kind: Literal["auto", "ray", "torch_distributed", "grpc", "inline"] = "auto"
    drafter_address: str | None = Field(None, description="grpc: host:port of an external Drafter service")
    master_port: int | None = Field(None, ge=1, le=65535, description="torch_distributed rendezvous port")


class ServeConfig(Strict):
    model: str = Field("smollm2-135m", description="target: alias, HF folder or .gguf file")
    served_model_name: str | None = Field(None, min_length=1, description="the name the APIs answer to; "
                                          "unset: model")
    speculative_config: dict[str, Any] | None = Field(
        default_factory=lambda: {"method": "ngram", "num_speculative_tokens": 2},
        description="vLLM-style keys; null serves without speculation")
    diffusion_config: dict[str, Any] | None = Field(
        None, description="diffusion LMs: block_length and steps_per_block of the static decoding served")
    generation_config: str = Field("auto", min_length=1, description="defaults of the sampling options a request "
                                   "leaves unset: auto (the model's generation_config.json, as vLLM), vllm "
                                   "(OpenAI's) or a folder holding a generation_config.json")
    router: RouterConfig = RouterConfig()
    pools: PoolsConfig = PoolsConfig()
    transport: TransportConfig = TransportConfig()
    http: HttpConfig = HttpConfig()
    grpc: GrpcConfig = GrpcConfig()
    ray_address: str | None = Field(None, description="join this Ray cluster; None starts a local one")

    @model_validator(mode="before")
    @classmethod
    def _default_speculation(cls, raw: Any) -> Any:
        # Unset: the default for the target and the device it runs on (cluster/config/defaults.py).
        # A default made for another target (a --model override of the defaults) follows the model.
        if isinstance(raw, dict) and isinstance(raw.get("model", ""), str):  # else the field's check names it
            model = raw.get("model") or "smollm2-135m"
            device = _target_device(raw)
            spec = raw.get("speculative_config", "unset")
            default = default_speculative_config(model, device)
            if spec == "unset" or (spec != default and spec in is_default_for_other(model, device)):
                raw = {**raw, "speculative_config": default}
        return raw

    @model_validator(mode="after")
    def _spec(self) -> "ServeConfig":
        """speculative_config (and diffusion_config) checked for the model they serve; ValueError says why."""
        if self.diffusion:
            from specray.cluster.config.diffusion import decode_options

            decode_options(self.speculative_config, self.diffusion_config)
            if self.pools.target.num_workers > 1:
                raise ValueError("a diffusion LM runs on one worker (pools.target.num_workers 1)")
            if self.pools.target.kernels in FAST_PARTS:  # it was served exact, the setting ignored
                raise ValueError(f"pools.target.kernels {self.pools.target.kernels!r} applies to autoregressive "
                                 f"GGUF models; {self.model!r} is a diffusion LM")
            ignored = self._autoregressive_only()
            if ignored:  # no KV cache, draft pool, prefill chunks or worker channel: they were ignored
                raise ValueError(f"{', '.join(ignored)} apply to autoregressive models; {self.model!r} is a "
                                 "diffusion LM")
            return self
        if self.diffusion_config:
            raise ValueError(f"diffusion_config applies to diffusion LMs; {self.model!r} is autoregressive")
        SpeculativeConfig.from_dict(self.speculative_config)
        return self

    def _autoregressive_only(self) -> list[str]:
        """The draft transport's settings, which only an autoregressive model's draft pool reads, and a
        generation_config folder (the router's KV and prefill settings are not refused: the Helm chart
        writes them for every model)."""
        ignored = ["transport"] if self.transport.kind not in ("auto", "inline") or self.transport.drafter_address \
            else []
        return ignored + (["generation_config"] if self.generation_config not in ("auto", "vllm") else [])

    @property
    def diffusion(self) -> bool:
        """The model is a diffusion LM (a LLaDA or Dream folder, or a packaged one)."""
        from specray.kernels.loader import is_diffusion_model

        return is_diffusion_model(self.model)

    def decode_options(self):
        """A diffusion LM's DecodeOptions (FreeDave's drafts and the blocks)."""
        from specray.cluster.config.diffusion import decode_options

        return decode_options(self.speculative_config, self.diffusion_config)

    @model_validator(mode="after")
    def _transport(self) -> "ServeConfig":
        if self.transport.kind == "grpc" and self.speculative_config and not self.transport.drafter_address:
            raise ValueError("transport.kind 'grpc' needs transport.drafter_address (host:port)")
        if self.transport.drafter_address and self.transport.kind != "grpc":  # it was ignored
            raise ValueError(f"transport.drafter_address is for transport.kind 'grpc', not {self.transport.kind!r}")
        address = self.transport.drafter_address
        host, _, port = (address or "").rpartition(":")
        if address and not (host and port.isdigit() and 0 < int(port) <= 65535):  # it waited, then "no drafter"
            raise ValueError(f"transport.drafter_address must be host:port, got {address!r}")
        if self.transport.master_port and self.transport.kind != "torch_distributed":
            raise ValueError("transport.master_port is for transport.kind 'torch_distributed', not "
                             f"{self.transport.kind!r}")
        self._draft_group()
        if self.grpc.enabled and self.grpc.port == self.http.port:
            raise ValueError(f"http.port and grpc.port are both {self.http.port}: the two servers need a port each")
        if self.http.server == "replica" and self.grpc.enabled and self.grpc.server == "proxy":
            raise ValueError("grpc.server 'proxy' needs http.server 'proxy': Ray Serve's proxy would take "
                             "http.port, which the replica's own HTTP server binds")
        return self

    def _draft_group(self) -> None:
        """pools.draft.num_workers > 1: a layer-parallel draft group (EasySpec across devices), each
        worker running one member's attention of every layer group; more workers than members idle."""
        workers = self.pools.draft.num_workers
        if workers == 1:
            return
        n = (self.speculative_config or {}).get("layer_parallel")
        if not n or n < 2:
            raise ValueError(f"pools.draft.num_workers {workers} needs speculative_config.layer_parallel >= 2: "
                             "a draft group splits each layer group's attentions over its workers")
        if workers > n:
            raise ValueError(f"pools.draft.num_workers {workers} exceeds speculative_config.layer_parallel {n}: "
                             "a layer group has only that many attentions to split")
        if self.draft_transport != "ray":
            raise ValueError(f"a draft group of {workers} workers needs transport.kind 'ray', got "
                             f"{self.transport.kind!r}")
        if self.pools.draft.device.startswith("cuda") and self.pools.draft.num_gpus < 1:
            raise ValueError("a CUDA draft group needs pools.draft.num_gpus >= 1: NCCL ranks cannot share a GPU")

    @property
    def draft_transport(self) -> str:
        """transport.kind with auto resolved: inline where the method drafts without a model (n-gram,
        ADED: a hop to another process a round costs more than their lookup), ray where it has one."""
        if self.transport.kind != "auto":
            return self.transport.kind
        name = self.speculative_method
        model_free = name in registry.METHODS and not registry.METHODS[name].needs_model
        return "inline" if model_free else "ray"

    @property
    def speculative(self) -> SpeculativeConfig | None:
        """The autoregressive speculative config (None for a diffusion LM: FreeDave is decode_options)."""
        return None if self.diffusion else SpeculativeConfig.from_dict(self.speculative_config)

    @property
    def speculative_method(self) -> str | None:
        """The method that serves: the parsed config's (one without "method" is n-gram, as vLLM's), a
        diffusion LM's own (freedave); None: no speculation."""
        spec = self.speculative
        return spec.method if spec is not None else (self.speculative_config or {}).get("method")

    @property
    def pipelined(self) -> bool:
        """Two groups in flight pay off only when drafting costs compute the target could overlap:
        with an n-gram draft, or a schedule that stops drafting once two sequences run (smollm2-135m's
        default), they halve the verified batch for nothing."""
        if self.router.pipelined != "auto":
            return self.router.pipelined
        if self.pools.colocate is True:  # workers in the router's process: nothing runs while it waits
            return False
        spec = self.speculative
        return spec is not None and registry.method(spec.method).needs_model and spec.draft_cap(2) > 0

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model

    def with_overrides(self, **overrides: Any) -> "ServeConfig":
        """A copy with dotted keys replaced, e.g. {"http.port": 8080}; None values are skipped."""
        raw = self.model_dump()
        for dotted, value in overrides.items():
            if value is None:
                continue
            node = raw
            *parents, leaf = dotted.split(".")
            for p in parents:
                node = node[p]
            node[leaf] = value
        return ServeConfig.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> "ServeConfig":
        try:
            return cls.model_validate(raw or {})
        except ValidationError as e:
            raise ValueError(_explain(e)) from None

    @classmethod
    def from_yaml(cls, path: str | Path) -> "ServeConfig":
        path = Path(path)
        if not path.exists():
            raise ValueError(f"config file {path} does not exist")
        try:
            raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeys)
        except (OSError, UnicodeDecodeError) as e:  # a folder, no permission, not text
            raise ValueError(f"config file {path} cannot be read: {e}") from None
        except yaml.YAMLError as e:
            raise ValueError(f"config file {path} is not valid YAML: {e}") from None
        if raw is not None and not isinstance(raw, dict):
            raise ValueError(f"config file {path} must hold a mapping at the top level")
        return cls.from_dict(raw)


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (the last one silently won)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _explain(e: ValidationError) -> str:
    lines = []
    for err in e.errors():
        where = ".".join(str(x) for x in err["loc"]) or "config"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append(f"{where}: {msg}")
    return "invalid config: " + "; ".join(lines)


def _target_device(raw: dict) -> str:
    """pools.target.device of a raw config (dicts or models), "cpu" where unset."""
    def part(node, key):
        return node.get(key) if isinstance(node, dict) else getattr(node, key, None)

    target = part(raw.get("pools") or {}, "target")
    return (part(target, "device") if target is not None else None) or "cpu"
