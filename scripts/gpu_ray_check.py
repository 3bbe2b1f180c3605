"""GPU check of the Ray pools (run on a CUDA machine with Ray): the target and the trained draft as
Ray actors sharing one GPU (num_gpus 0.5 each, fp16), draft tokens over Ray, the router driven from
this process. Greedy outputs must equal the in-process engine's on the same device; tokens/s of
both at 1 and 8 sequences; then the torch_distributed transport, which needs NCCL ranks on
separate GPUs (a one-GPU machine should refuse it clearly). Each part's JSON is written to $OUT (or
the cwd) as soon as it is done, so a hang in a later part keeps the earlier ones.

    python scripts/gpu_ray_check.py --model smollm2-135m --num-prompts 8 --max-tokens 64
    python scripts/gpu_ray_check.py --device cpu --dtype float32 ...   # the same check on CPU
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from pathlib import Path

OUT = Path(os.environ.get("OUT", "."))


def write(name: str, part: dict) -> None:
    (OUT / f"{name}.json").write_text(json.dumps(part, indent=2))
    print(name, json.dumps(part), flush=True)


def prompts(model: str, num: int) -> list[list[int]]:
    from specray.cluster.bench.prompts import load_prompts
    from specray.kernels.chat import prompt_token_ids
    from specray.kernels.loader import resolve

    tok = resolve(model).tokenizer()
    return [prompt_token_ids(tok, p["prompt"]) for p in load_prompts(None, num)]


def drive(router, ids: list[list[int]], params) -> tuple[list[list[int]], float]:
    """Every prompt through `router` from this thread -> (token ids in prompt order, seconds)."""
    start = time.perf_counter()
    rids = [router.add_request(p, params) for p in ids]
    done = {}
    while router.has_unfinished():
        done.update({o.request_id: o for o in router.step() if o.finished})
    return [done[r].outputs[0].token_ids for r in rids], time.perf_counter() - start


def serve_config(args, spec: dict, transport: str, seqs: int):
    from specray.cluster.config.serve import ServeConfig

    pool = {"device": args.device, "dtype": args.dtype, "num_gpus": 0.5 if args.device != "cpu" else 0}
    return ServeConfig.from_dict({
        "model": args.model, "speculative_config": spec, "transport": {"kind": transport},
        "pools": {"colocate": False, "target": pool, "draft": pool},
        "router": {"max_num_seqs": seqs, "pipelined": False, "kv_cache_tokens": 8192}})


def ray_pools(args, spec: dict, ids, params, seqs: int, transport: str = "ray") -> tuple[list, float]:
    from specray.cluster.serve.runtime import build_runtime

    runtime = build_runtime(serve_config(args, spec, transport, seqs))
    try:
        runtime.async_router.shutdown()  # this thread drives the router
        drive(runtime.router, ids[:1], params)  # warm-up
        return drive(runtime.router, ids, params)
    finally:
        runtime.shutdown()


def in_process(args, spec: dict, ids, params, seqs: int) -> tuple[list, float]:
    from specray import LLM

    llm = LLM(args.model, speculative_config=spec, device=args.device, dtype=args.dtype, max_num_seqs=seqs,
              kv_cache_tokens=8192)
    drive(llm.router, ids[:1], params)
    return drive(llm.router, ids, params)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()

    import ray
    import torch

    from specray import SamplingParams
    from specray.cluster.config.defaults import trained_draft_config

    gpus = torch.cuda.device_count() if args.device != "cpu" else 0
    ray.init(address="local", num_cpus=8, num_gpus=gpus, resources={"target": 4, "draft": 4}, include_dashboard=False)
    spec = {**trained_draft_config(args.model), "disable_by_batch_size": None}
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    ids = prompts(args.model, args.num_prompts)
    tokens = len(ids) * args.max_tokens
    head = {"device": torch.cuda.get_device_name() if gpus else "cpu", "torch": torch.__version__,
            "ray": ray.__version__, "spec": spec, "prompts": len(ids), "max_tokens": args.max_tokens}
    write("gpu_ray_head", head)
    for seqs in (1, 8):
        want, t_local = in_process(args, spec, ids, params, seqs)
        plain, t_plain = in_process(args, None, ids, params, seqs)
        got, t_ray = ray_pools(args, spec, ids, params, seqs)
        write(f"gpu_ray_seqs{seqs}", {
            "ray_equals_in_process": got == want, "spec_equals_plain": want == plain,
            "tokens_per_s": {"in_process_plain": round(tokens / t_plain, 1),
                             "in_process_spec": round(tokens / t_local, 1), "ray_pools_spec": round(tokens / t_ray, 1)}})
    try:
        got, t = ray_pools(args, spec, ids[:2], params, 1, transport="torch_distributed")
        part = {"ran": True, "equals_in_process": got == want[:2], "seconds": round(t, 2)}
    except Exception as e:  # noqa: BLE001 - a one-GPU machine is expected to refuse NCCL ranks on one GPU
        part = {"ran": False, "error": f"{type(e).__name__}: {e}"[:2000], "trace": traceback.format_exc()[-3000:]}
    write("gpu_ray_dist", part)
    ray.shutdown()


if __name__ == "__main__":
    main()
