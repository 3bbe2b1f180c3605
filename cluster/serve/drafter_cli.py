"""`specray drafter`: a draft pool served over gRPC outside the Ray cluster (the router's grpc
transport points at it)."""

from __future__ import annotations

import argparse
import json

from specray.cluster.args import json_object, non_negative_int, positive_int
from specray.cluster.config.defaults import DEFAULT_LOOKUP_MIN
from specray.kernels.drafters.registry import METHODS

DRAFTER_BLOCK_SIZE = 16  # the router's default block size; the drafter's KV is its own


def add_drafter_parser(sub) -> None:
    p = sub.add_parser("drafter", help="serve a draft pool over gRPC (the router's grpc transport)",
                       description="Runs a Drafter service outside the Ray cluster; point `specray serve "
                                   "--transport grpc --drafter-address host:port` at it.")
    p.add_argument("--method", default="ngram", choices=list(METHODS),
                   help="the draft method served (default ngram); specray serve checks it matches its own")
    p.add_argument("--model", help="draft checkpoint (draft_model, eagle, longspec); the target's tokenizer folder (aded)")
    p.add_argument("--tree", type=json_object, help="draft_model trees, as in speculative_config, e.g. "
                                                     "'{\"kind\": \"rsd_c\", \"branching\": [2, 2, 1]}'")
    p.add_argument("--aded", type=json_object, help="ADED options as in speculative_config (method aded)")
    p.add_argument("--longspec", type=json_object, help="LongSpec options as in speculative_config, e.g. "
                                                        "'{\"window\": 256}' (method longspec)")
    p.add_argument("--vocab-trim", type=non_negative_int, help="VocabTrim size (0 = off; default: the draft folder's)")
    p.add_argument("--quantization", choices=["q8_0", "q4_1", "none"],
                   help="draft weights: q8_0, q4_1 or none (default: q8_0 on CPU in fp32; lossless whichever)")
    p.add_argument("--num-layers", type=positive_int, help="keep only the draft's first layers")
    p.add_argument("--layer-parallel", type=positive_int, help="draft_model: EasySpec layer-parallel drafting, middle "
                                                      "layers in groups of this many (1: ordinary drafting)")
    p.add_argument("--prompt-lookup-min", type=int, default=DEFAULT_LOOKUP_MIN,
                   help=f"ngram: shortest suffix matched in the context (default {DEFAULT_LOOKUP_MIN}, as specray serve's)")
    p.add_argument("--prompt-lookup-max", type=int, default=4,
                   help="ngram: longest suffix matched in the context (default 4)")
    p.add_argument("--lookup-first", action="store_true", help="draft_model / eagle: prompt lookup first: a draft model proposes only where the last tokens never occurred before")
    p.add_argument("--dtype", default="float32", help="draft weights' dtype: float32 | bfloat16 | float16 | auto "
                   "(float32)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--kv-cache-tokens", type=positive_int, default=16384, help="the draft's KV cache, in tokens")
    p.add_argument("--host", default="127.0.0.1",
                   help="interface to listen on (default 127.0.0.1, as specray serve's; 0.0.0.0 or [::]: every "
                        "interface, for a router on another machine: the drafter has no authentication, so a "
                        "trusted network only)")
    p.add_argument("--port", type=port_number, default=50061, help="0: any free port")
    p.set_defaults(func=cmd_drafter)


def port_number(text: str) -> int:
    """argparse type: a TCP port, 0-65535 (gRPC took 70000 as 4464)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in [0, 65535], got {port}")
    return port


def drafter_spec(args):
    """The DraftSpec `specray drafter` serves, validated as the router validates speculative_config."""
    from specray.cluster.config.speculative import SpeculativeConfig
    from specray.cluster.config.worker_specs import draft_spec

    from specray.cluster.llm_inputs import check_engine_args, dtype_name, parse_dtype

    weights = parse_dtype(args.dtype)
    check_engine_args(args.device, args.kv_cache_tokens, DRAFTER_BLOCK_SIZE, dtype=weights)
    dtype = dtype_name(weights)  # "auto" -> float32, as the worker's spec names it
    if args.method == "aded" and not args.model:
        raise ValueError("--method aded needs --model: the target whose tokenizer the tri-gram table uses")
    draft = None if args.method == "aded" else args.model  # aded's --model is the target (its tokenizer), no draft
    spec = SpeculativeConfig(method=args.method, model=draft, draft_num_layers=args.num_layers,
                             prompt_lookup_min=args.prompt_lookup_min, prompt_lookup_max=args.prompt_lookup_max,
                             tree=args.tree, aded=args.aded, longspec=args.longspec, draft_vocab_trim=args.vocab_trim,
                             draft_quantization=args.quantization, lookup_first=args.lookup_first or None,
                             layer_parallel=args.layer_parallel)
    return draft_spec(spec, args.model, dtype, args.device, args.kv_cache_tokens, DRAFTER_BLOCK_SIZE)


def drafter_argv(spec, target: str) -> list[str]:
    """`specray drafter` flags serving `spec` (a SpeculativeConfig) for `target`: what drafter_spec
    reads back (lookup_first's options dict becomes the plain flag)."""
    argv = ["--method", spec.method, "--prompt-lookup-min", str(spec.prompt_lookup_min),
            "--prompt-lookup-max", str(spec.prompt_lookup_max)]
    model = target if spec.method == "aded" else spec.model  # aded reads the target's tokenizer
    argv += ["--model", model] if model else []
    for flag, value in (("--tree", spec.tree), ("--aded", spec.aded), ("--longspec", spec.longspec)):
        argv += [flag, json.dumps(value)] if value is not None else []
    for flag, value in (("--vocab-trim", spec.draft_vocab_trim), ("--quantization", spec.draft_quantization),
                        ("--num-layers", spec.draft_num_layers), ("--layer-parallel", spec.layer_parallel)):
        argv += [flag, str(value)] if value is not None else []
    return argv + (["--lookup-first"] if spec.lookup_first else [])


def cmd_drafter(args) -> int:
    from specray.cluster.pools.draft_endpoint import DraftEndpoint
    from specray.cluster.pools.grpc_transport import serve_drafter
    from specray.cluster.pools.heap import freeze_startup_heap

    spec = drafter_spec(args)
    server, port = serve_drafter(DraftEndpoint.from_spec(spec), f"{args.host}:{args.port}")
    freeze_startup_heap()
    print(f"specray drafter ({args.method}) listening on {args.host}:{port}", flush=True)
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        server.stop(grace=2)
    return 0
