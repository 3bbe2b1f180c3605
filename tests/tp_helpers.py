"""A scripted target-worker session, run by a single worker and by every tensor-parallel rank.

Lives outside the test modules so that spawned ranks can import it (tests/ is on sys.path).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import torch

from specray.actors.messages import SeqSpec, TargetItem
from specray.actors.specs import TargetSpec
from specray.actors.target_worker import TargetWorker
from specray.kernels.proposal import Proposal
from specray.kernels.sampling import SamplingConfig

PROMPTS = {"g": [5, 17, 33, 2, 80, 41, 9], "s": [3, 4, 5, 6], "d": [10, 20, 30], "n": [7, 8, 9, 10, 11]}
SPECS = {
    "g": SeqSpec(SamplingConfig(temperature=0.0), logprobs=2),
    "s": SeqSpec(SamplingConfig(temperature=0.2, top_k=20), seed=7),
    "d": SeqSpec(SamplingConfig(temperature=1.0, top_p=0.9), seed=11, logprobs=0),
    "n": SeqSpec(SamplingConfig(temperature=0.0)),
}
NUM_STEPS = 7
RELEASE_AT = 3  # "s" is released after this step and "n" joins, reusing its blocks


def greedy_oracle(worker: TargetWorker, prompt: list[int], num_tokens: int) -> list[int]:
    """The target's greedy continuation (target-only decoding), to draft from with real acceptance."""
    seq_id, pending, out = "oracle", prompt, []
    for i in range(num_tokens):
        item = TargetItem(seq_id, pending, Proposal([]), SeqSpec(SamplingConfig(temperature=0.0)) if i == 0 else None)
        pending = [worker.step([item])[0].next_token_id]
        out += pending
    worker.release(seq_id)
    return out


def _proposal(seq: str, step: int, k: int, committed: list[int], oracle: list[int], vocab_size: int) -> Proposal:
    if seq == "d":  # dense proposal distributions, tokens drawn from them
        gen = torch.Generator().manual_seed(100 + step)
        probs = (0.5 * torch.randn(k, vocab_size, generator=gen)).softmax(-1)  # [k, vocab_size]
        tokens = torch.multinomial(probs, 1, generator=gen)[:, 0].tolist() if k else []
        return Proposal(tokens, probs)
    start = len(committed) - len(PROMPTS[seq])
    tokens = (oracle[start:start + k] + [3] * k)[:k]
    if k and step % 3 == 1:
        tokens[-1] = (tokens[-1] + 1) % vocab_size  # a wrong last token: partial acceptance
    return Proposal(tokens)


def run_script(worker: TargetWorker) -> dict:
    """Decode greedy oracles; then prefill, and verify proposals of 0-3 tokens for greedy,
    point-sampled and dense-sampled sequences; release one mid-way.
    -> {"results": [(step, seq, VerifyResult as dict)], "logits": [step logits], "kv": cache}."""
    vocab_size = worker.model.config.vocab_size
    oracles = {s: greedy_oracle(worker, PROMPTS[s], 30) for s in ("g", "s", "n")}
    logits: list[torch.Tensor] = []
    hook = worker.model.register_forward_hook(lambda module, args, out: logits.append(out.clone()))
    active = ["g", "s", "d"]
    committed = {s: list(p) for s, p in PROMPTS.items()}
    pending = {s: list(p) for s, p in PROMPTS.items()}
    results = []
    for step in range(NUM_STEPS):
        items = []
        for i, seq in enumerate(active):
            k = (step + i) % 4
            proposal = _proposal(seq, step, k, committed[seq], oracles.get(seq, []), vocab_size)
            first = len(committed[seq]) == len(PROMPTS[seq])
            items.append(TargetItem(seq, pending[seq], proposal, SPECS[seq] if first else None))
        for seq, res in zip(active, worker.step(items), strict=True):
            results.append((step, seq, dataclasses.asdict(res)))
            committed[seq] += res.emitted_token_ids
            pending[seq] = [res.next_token_id]
        if step == RELEASE_AT:
            worker.release("s")
            active = ["g", "n", "d"]
    hook.remove()
    return {"results": results, "logits": logits, "kv": worker.cache.kv.clone()}


def tp_rank_main(rank: int, world_size: int, init_method: str, models: dict[str, str], out_dir: str) -> None:
    """A spawned rank: build a TargetWorker shard per model (one process group), run the script."""
    torch.set_num_threads(1)
    import torch.distributed as dist

    for name, folder in models.items():
        spec = TargetSpec(model=folder, num_blocks=64, block_size=4, threads=1, tp_rank=rank,
                          tp_size=world_size, dist_init_method=init_method, enable_prefix_caching=True)
        worker = TargetWorker.from_spec(spec)
        out = run_script(worker)
        out["tp_info"] = worker.tp_info()
        torch.save(out, Path(out_dir) / f"{name}-{rank}.pt")
    dist.destroy_process_group()


def start_ranks(fn, world_size: int, args: tuple):
    """Start fn(rank, *args) in world_size spawned processes; wait with `join_ranks`."""
    import torch.multiprocessing as mp

    return mp.start_processes(fn, args=args, nprocs=world_size, join=False, start_method="spawn")


def join_ranks(ctx, timeout_s: float = 120.0) -> None:
    """Wait for the ranks; raise on a child's error or a timeout (killing the ranks)."""
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=1.0):  # raises ProcessRaisedException with the child's traceback
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                proc.kill()
            raise TimeoutError(f"tensor-parallel ranks still running after {timeout_s} s")
