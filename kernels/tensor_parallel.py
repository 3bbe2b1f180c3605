"""Tensor parallelism (Megatron-style) for the Llama runtime, exact up to the all-reduce's rounding.

Rank r of n keeps
- attention: KV heads [r * kv / n, (r + 1) * kv / n) and the query heads grouped on them (rows of the
  fused qkv, columns of o_proj); the o_proj outputs are partial sums, all-reduced;
- MLP: a slice of the intermediate size (rows of gate and of up, columns of down_proj), all-reduced;
- LM head: its vocab rows when n divides vocab_size (logits all-gathered), else the whole head;
- embeddings and norms: whole.
Its KV cache then holds only its own KV heads.

Collectives come from a `TPGroup`: `DistributedTPGroup` (torch.distributed: gloo on CPU, NCCL on GPU)
or `ThreadTPGroup` (ranks as threads of one process, for tests).
"""

from __future__ import annotations

import dataclasses
import socket
import threading

import torch
import torch.distributed as dist
from torch import nn

from specray.kernels.config import ModelConfig
from specray.kernels.model import LlamaModel
from specray.kernels.tp_group import TPGroup


# -- sharding ---------------------------------------------------------------------------------
def check_shardable(config: ModelConfig, world_size: int) -> None:
    """Raise ValueError unless KV heads and the MLP intermediate size split evenly over world_size."""
    if world_size < 1:
        raise ValueError(f"tensor-parallel size must be >= 1, got {world_size}")
    uneven = [f"{name}={value}" for name, value in
              (("num_kv_heads", config.num_kv_heads), ("intermediate_size", config.intermediate_size))
              if value % world_size]
    if uneven:
        raise ValueError(f"tensor parallelism over {world_size} ranks splits KV heads and the MLP evenly: "
                         f"num_kv_heads and intermediate_size must be divisible by {world_size}, got "
                         f"{', '.join(uneven)}")


def shard_config(config: ModelConfig, world_size: int) -> ModelConfig:
    """Per-rank shapes (heads, KV heads, intermediate size); vocab_size stays the full logits width."""
    check_shardable(config, world_size)
    return dataclasses.replace(config, num_heads=config.num_heads // world_size,
                               num_kv_heads=config.num_kv_heads // world_size,
                               intermediate_size=config.intermediate_size // world_size)


def _part(weight: torch.Tensor, rank: int, world_size: int, dim: int = 0) -> torch.Tensor:
    """Rank's contiguous 1/world_size slice along dim, copied so the full weight can be freed."""
    size = weight.shape[dim] // world_size
    return weight.narrow(dim, rank * size, size).clone(memory_format=torch.contiguous_format)


def shard_model(model: LlamaModel, group: TPGroup) -> LlamaModel:
    """Keep only rank `group.rank`'s shard of a loaded, unsharded model (in place) and route its
    forward through `group`'s collectives. Rebuilds the packed and GEMV weights if the model had them."""
    c, rank, n = model.config, group.rank, group.size
    local = shard_config(c, n)
    if not 0 <= rank < n:
        raise ValueError(f"tensor-parallel rank must be in [0, {n}), got {rank}")
    if model.tp_group.size != 1:
        raise ValueError("the model is already sharded")
    had_gemv, had_packed = bool(model.gemv_weights), bool(model.packed_weights)
    model.gemv_weights, model.packed_weights = {}, {}  # keyed by id(weight): stale once replaced
    with torch.no_grad():
        for layer in model.layers:
            q, k, v = layer.qkv_proj.split([c.q_size, c.kv_size, c.kv_size])
            # query heads are grouped by KV head (head h reads KV head h // group), so equal row
            # slices of q, k and v keep each rank's query heads with their own KV heads
            layer.qkv_proj = nn.Parameter(torch.cat([_part(w, rank, n) for w in (q, k, v)]))
            layer.o_proj = nn.Parameter(_part(layer.o_proj, rank, n, dim=1))
            gate, up = layer.gate_up_proj.chunk(2)
            layer.gate_up_proj = nn.Parameter(torch.cat([_part(gate, rank, n), _part(up, rank, n)]))
            layer.down_proj = nn.Parameter(_part(layer.down_proj, rank, n, dim=1))
        model.vocab_parallel = n > 1 and c.vocab_size % n == 0
        if model.vocab_parallel:  # a tied head is untied here: the embedding stays whole
            model.lm_head = nn.Parameter(_part(model.lm_head, rank, n))
    model.shard_config = local
    model.tp_group = group
    if had_packed:
        model.add_packed_weights()
    if had_gemv:
        model.add_gemv_weights()
    return model


# -- torch.distributed ------------------------------------------------------------------------
class DistributedTPGroup(TPGroup):
    """Collectives over a torch.distributed process group (None: the default group)."""

    def __init__(self, group: dist.ProcessGroup | None = None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        # gloo and NCCL reduce each element once and broadcast it, so every rank gets the same bits
        dist.all_reduce(x, op=dist.ReduceOp.SUM, group=self.group)
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x, group=self.group)
        return torch.cat(parts, dim=-1)


def default_backend(device: str) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def init_distributed(rank: int, world_size: int, init_method: str | None = None,
                     backend: str | None = None, device: str = "cpu") -> DistributedTPGroup:
    """Join (or create) the default process group; blocks until all world_size ranks have joined.

    init_method None means torch's "env://" (MASTER_ADDR / MASTER_PORT); backend None picks NCCL for
    a CUDA device and gloo otherwise.
    """
    if not dist.is_initialized():
        dist.init_process_group(backend or default_backend(device), init_method=init_method,
                                rank=rank, world_size=world_size)
    elif (dist.get_rank(), dist.get_world_size()) != (rank, world_size):
        raise RuntimeError(f"a process group is already initialised as rank {dist.get_rank()} of "
                           f"{dist.get_world_size()}, not rank {rank} of {world_size}")
    return DistributedTPGroup()


def free_init_method(host: str = "127.0.0.1") -> str:
    """A tcp:// init method on a port that is free now on `host` (run it on rank 0's machine)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return f"tcp://{host}:{s.getsockname()[1]}"


# -- in-process ranks (tests) -----------------------------------------------------------------
class ThreadTPGroup(TPGroup):
    """One rank of a group whose ranks are threads of this process; build them with `thread_groups`."""

    def __init__(self, rank: int, size: int, barrier: threading.Barrier, slots: list):
        self.rank, self.size = rank, size
        self._barrier, self._slots = barrier, slots

    def _exchange(self, x: torch.Tensor) -> list[torch.Tensor]:
        self._slots[self.rank] = x
        self._barrier.wait()
        parts = list(self._slots)
        self._barrier.wait()  # nobody overwrites a slot before every rank has read them all
        return parts

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        parts = self._exchange(x)
        total = parts[0].clone()
        for part in parts[1:]:  # rank order on every rank: the same bits everywhere
            total += part
        return total

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat(self._exchange(x), dim=-1)


def thread_groups(size: int, timeout_s: float = 60.0) -> list[ThreadTPGroup]:
    barrier = threading.Barrier(size, timeout=timeout_s)
    slots: list = [None] * size
    return [ThreadTPGroup(rank, size, barrier, slots) for rank in range(size)]
