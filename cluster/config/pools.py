"""The `pools` section of the serving config: where and how the draft and target workers run, and
how the router reaches them (cluster/config/serve.py holds the rest)."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from specray.kernels.kernel_modes import FAST_PARTS, KERNEL_SETTINGS, KERNELS_AUTO


MAX_SETTING = 2**31 - 1  # Ray's and torch's int32 fields: a larger count failed deep in a deployment


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    @field_validator("*")
    @classmethod
    def _sized(cls, v: Any) -> Any:
        """Numbers a deployment can use: integers up to 2^31 - 1, finite floats (the field named)."""
        if isinstance(v, int) and not isinstance(v, bool) and v > MAX_SETTING:
            raise ValueError(f"must be at most {MAX_SETTING}, got {v}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"must be a finite number, got {v}")
        return v


class PoolConfig(Strict):
    """Where and how one pool's workers run."""

    num_workers: int = Field(1, ge=1, description="target: tensor-parallel degree; draft: 1, or a "
                             "layer-parallel draft group's size (speculative_config.layer_parallel)")
    num_cpus: float = Field(1.0, ge=0, description="CPUs each worker reserves")
    num_gpus: float = Field(0.0, ge=0, description="GPUs each worker reserves")
    resources: dict[str, float] = Field(default_factory=dict,
                                        description="custom Ray resources the worker's node must advertise")
    threads: int | None = Field(None, ge=1, description="torch intra-op threads per worker; unset: a target "
                                "worker uses its node's cores / num_workers, a draft worker its num_cpus")
    dtype: str = Field("float32", description="weights' dtype: float32 | bfloat16 | float16 (fp32, bf16, "
                       "fp16), or auto: float32")
    device: str = Field("cpu", description="cpu, cuda or cuda:N (checked where the worker starts)")

    @field_validator("resources")
    @classmethod
    def _positive(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {k: x for k, x in v.items() if not (x > 0 and math.isfinite(x))}  # NaN too
        if bad:
            raise ValueError(f"resource amounts must be finite and > 0, got {bad}")
        return v

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v: str) -> str:
        from specray.cluster.llm_inputs import dtype_name, parse_dtype

        return dtype_name(parse_dtype(v))  # auto (vLLM's default) is float32, as in LLM

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        from specray.cluster.llm_inputs import parse_device

        parse_device(v)  # whether the worker's node has it is checked where the worker starts
        return v


class TargetPoolConfig(PoolConfig):
    resources: dict[str, float] = Field(default_factory=lambda: {"target": 1.0},
                                        description="custom Ray resources the worker's node must advertise")
    kernels: Literal[KERNEL_SETTINGS] = Field(
        KERNELS_AUTO, description="numeric mode of the CPU kernels on GGUF weights: exact (the fp32 model, what "
        "transformers computes), fast16 (integer dot products on 16-bit activations in two 8-bit parts) or "
        "fast (8-bit activations); both fast modes keep a 16-bit KV cache and are lossless against themselves; "
        "auto (default): fast16 for a GGUF model on a CPU in fp32, else exact")

    @model_validator(mode="after")
    def _fast_on_cpu(self) -> "TargetPoolConfig":
        if self.kernels in FAST_PARTS and (not self.device.startswith("cpu") or self.dtype != "float32"):
            raise ValueError(f"kernels {self.kernels!r} is a CPU kernels' mode on fp32 weights; device {self.device!r} "
                             f"with dtype {self.dtype!r} would not use it: use kernels 'exact'")
        return self


class DraftPoolConfig(PoolConfig):
    resources: dict[str, float] = Field(default_factory=lambda: {"draft": 1.0},
                                        description="custom Ray resources the worker's node must advertise")


class PoolsConfig(Strict):
    # each pool's default resources apply whether or not the pool's block is given
    target: TargetPoolConfig = TargetPoolConfig()
    draft: DraftPoolConfig = DraftPoolConfig()
    colocate: bool | Literal["auto"] = Field(
        False, description="the target worker (and a draft worker on transport 'ray') inside the Serve "
        "replica beside the router: no actor call a round, the replica reserves their resources; auto: "
        "on a one-node cluster with one CPU worker a pool; false (default): separate actor pools")
    channel: Literal["auto", "ray"] = Field(
        "auto", description="how the router calls a lone pool worker each round: auto: a Unix socket where the "
        "worker runs on the router's node (Ray actor calls elsewhere); ray: Ray actor calls always")

    @model_validator(mode="after")
    def _colocatable(self) -> "PoolsConfig":
        if self.colocate is True and (self.target.num_workers > 1 or self.draft.num_workers > 1):
            raise ValueError("pools.colocate true runs one target and one draft worker in the replica: "
                             "tensor-parallel targets and draft groups need colocate false")
        return self

    def colocated(self, num_nodes: int) -> bool:
        """Whether the workers run in the replica, on a cluster of `num_nodes` alive nodes."""
        if self.colocate != "auto":
            return self.colocate
        pools = (self.target, self.draft)
        return num_nodes == 1 and all(p.num_workers == 1 and p.num_gpus == 0 and p.device == "cpu" for p in pools)
