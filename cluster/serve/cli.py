"""`specray serve`: the main job. Starts (or joins) a Ray cluster, deploys the Serve application
and prints its endpoints."""

from __future__ import annotations

import argparse
import signal
import sys
import time

from specray.cluster.args import int_or_auto, json_object
from specray.cluster.serve.banner import endpoint_banner
from specray.cluster.speculation_flags import speculative_override
from specray.kernels.drafters.registry import METHODS
from specray.kernels.kernel_modes import KERNEL_SETTINGS

# flag -> dotted ServeConfig key; flags left unset keep the config file's (or the default) value
FLAG_KEYS = {
    "model": "model", "served_model_name": "served_model_name", "host": "http.host", "port": "http.port",
    "api_key": "http.api_key", "api_key_file": "http.api_key_file", "grpc_port": "grpc.port",
    "grpc_tls_cert": "grpc.tls_cert_file", "grpc_tls_key": "grpc.tls_key_file", "max_num_seqs": "router.max_num_seqs",
    "max_prefill_tokens": "router.max_prefill_tokens", "max_waiting": "router.max_waiting", "kv_cache_tokens": "router.kv_cache_tokens",
    "enable_prefix_caching": "router.enable_prefix_caching", "generation_config": "generation_config",
    "max_model_len": "router.max_model_len", "transport": "transport.kind",
    "drafter_address": "transport.drafter_address", "tensor_parallel_size": "pools.target.num_workers",
    "draft_workers": "pools.draft.num_workers", "kernels": "pools.target.kernels", "worker_channel": "pools.channel",
    "address": "ray_address",
}


def add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve the OpenAI-compatible HTTP and gRPC APIs on Ray",
                       description="With no flags: a local Ray cluster, SmolLM2-135M as the target on CPU, "
                                   "adaptive prompt lookup (a diffusion LM: FreeDave). Flags "
                                   "override the --config file, which overrides defaults.")
    add_serve_flags(p)
    p.add_argument("--dry-run", action="store_true", help="print the resolved config as YAML and exit (the model, "
                   "draft, key file and ports are checked only when it starts)")
    p.set_defaults(func=cmd_serve)


def add_serve_flags(p) -> None:
    """Every flag that shapes a ServeConfig (shared with `specray bench cluster`)."""
    p.add_argument("--config", help="YAML file with ServeConfig keys (see docs/serving.md)")
    p.add_argument("--address", help="join this Ray cluster (e.g. auto or ray://host:10001) instead of starting one")
    p.add_argument("--model", help="target: alias, HF folder or .gguf file (default smollm2-135m)")
    p.add_argument("--served-model-name", help="the model name the APIs answer to (default: --model)")
    p.add_argument("--host", help="interface HTTP and gRPC listen on (default 127.0.0.1; 0.0.0.0: every interface)")
    p.add_argument("--port", type=int, help="HTTP port (default 8000)")
    p.add_argument("--grpc-port", type=int, help="gRPC port (default 9000)")
    p.add_argument("--grpc-tls-cert", help="PEM certificate chain: serve gRPC over TLS (with --grpc-tls-key)")
    p.add_argument("--grpc-tls-key", help="PEM private key of --grpc-tls-cert")
    p.add_argument("--api-key-file", help="require 'Authorization: Bearer <key>', the key read from this file "
                                          "(or set SPECRAY_API_KEY)")
    p.add_argument("--api-key", help="as --api-key-file, the key given inline: other users of the machine "
                                     "can read it in the process list")
    p.add_argument("--speculative-config", type=json_object,
                   help="the whole speculative_config as JSON, as vLLM takes it (trees, budgets, lookup_first, ...); "
                        "not with the other speculation flags")
    p.add_argument("--speculative-method", choices=[*METHODS, "freedave", "none"],
                   help="speculative_config.method; none serves without speculation; freedave for a diffusion LM")
    p.add_argument("--draft-model", help="speculative_config.model: the draft checkpoint or alias")
    p.add_argument("--num-speculative-tokens", type=int, help="speculative_config.num_speculative_tokens: draft tokens a round")
    p.add_argument("--lookup-first", action="store_true", help="draft_model / eagle: prompt lookup first: a draft model proposes only where the last tokens never occurred before")
    p.add_argument("--adaptive-speculation", choices=["on", "off"],
                   help="speculative_config.adaptive: each round, each sequence drafts the length (at most "
                        "--num-speculative-tokens) that maximises expected tokens per cost, from its acceptance "
                        "and this machine's measured step costs (default: on with the default speculation and eagle, else off)")
    p.add_argument("--pipeline", dest="pipelined", choices=["auto", "on", "off"],
                   help="two groups in flight (on), one (off), or two only with a draft model (auto, default)")
    p.add_argument("--no-pipeline", dest="pipelined", action="store_const", const="off",
                   help="same as --pipeline off")
    p.add_argument("--transport", choices=["auto", "ray", "torch_distributed", "grpc", "inline"],
                   help="how proposals reach the router: inline (the draft worker in the router process, no hop "
                        "a round), ray (a draft actor pool), torch_distributed, grpc (an external `specray drafter`); "
                        "default auto: inline for ngram and aded, ray for a draft model")
    p.add_argument("--drafter-address", help="host:port of a `specray drafter` (grpc transport)")
    p.add_argument("--colocate", choices=["auto", "on", "off"],
                   help="the target (and a ray-transport draft) worker inside the Serve replica, beside the router: "
                        "no actor call a round (on); separate actor pools (off, default); on only on a one-node "
                        "CPU cluster with one worker a pool (auto)")
    p.add_argument("--worker-channel", choices=["auto", "ray"],
                   help="how the router calls a lone pool worker each round: a Unix socket where it runs on the "
                        "router's node (auto, default), or Ray actor calls always (ray)")
    p.add_argument("--tensor-parallel-size", type=int, help="target workers sharing the model")
    p.add_argument("--kernels", choices=list(KERNEL_SETTINGS),
                   help="the target's CPU kernels on GGUF weights: exact (the fp32 model), fast16 (integer dot "
                        "products on 16-bit activations in two 8-bit parts) or fast (8-bit activations); the fast "
                        "modes keep a 16-bit KV cache and are models of their own, speculation lossless against "
                        "each; auto (default): fast16 for a GGUF model on a CPU in fp32, else exact")
    p.add_argument("--draft-workers", type=int, help="draft workers of one layer-parallel group (EasySpec across "
                                                     "devices; needs speculative_config layer_parallel >= it)")
    p.add_argument("--max-num-seqs", type=int, help="running sequences at most")
    p.add_argument("--max-prefill-tokens", type=int_or_auto,
                   help="prompt tokens a round prefills at most; a longer prompt prefills in chunks over several "
                        "rounds; auto (the default): 256 on CPU (64 while other sequences decode), 512 on an accelerator")
    p.add_argument("--max-waiting", type=int, help="sequences waiting beyond the running batch's free places before 429 / RESOURCE_EXHAUSTED")
    p.add_argument("--kv-cache-tokens", type=int, help="target KV cache size in tokens")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="take a prompt's KV blocks that an earlier request computed instead of computing them "
                        "again (default: on; outputs are the same either way)")
    p.add_argument("--max-model-len", type=int, help="longest prompt + output (default: the model's context)")
    p.add_argument("--generation-config", help="defaults of the sampling options a request leaves unset: auto "
                   "(default: the model's generation_config.json, as vLLM), vllm (OpenAI's) or a folder")
    from specray.cluster.diffusion_args import add_diffusion_args

    add_diffusion_args(p)


def resolve_config(args):
    from specray.cluster.config.serve import ServeConfig

    cfg = ServeConfig.from_yaml(args.config) if args.config else ServeConfig()
    overrides = {key: getattr(args, flag) for flag, key in FLAG_KEYS.items()}
    overrides["router.pipelined"] = {"on": True, "off": False}.get(args.pipelined, args.pipelined)
    overrides["pools.colocate"] = {"on": True, "off": False}.get(args.colocate, args.colocate)
    from specray.cluster.diffusion_args import serve_overrides

    model = args.model or cfg.model
    whole = serve_overrides(args, model, cfg.speculative_config, cfg.diffusion_config)  # diffusion LMs: FreeDave, blocks
    spec = False if whole else speculative_override(args, cfg.speculative_config, model)
    if spec is not False:
        whole["speculative_config"] = spec
    raw = cfg.model_dump()
    for dotted, value in overrides.items():  # dotted keys of sections; validated once, below
        if value is not None:
            *parents, leaf = dotted.split(".")
            node = raw
            for part in parents:
                node = node[part]
            node[leaf] = value
    return ServeConfig.from_dict({**raw, **whole})


def check_model_and_context(cfg) -> None:
    """A missing model or draft, a draft another method serves, or a context the model or the KV cache
    cannot hold fails here in one line, before Ray starts (in a replica it failed after three
    deployment attempts, with tracebacks)."""
    from specray.cluster.config.worker_specs import num_blocks
    from specray.cluster.router.limits import fit_context
    from specray.cluster.serve.runtime import runtime_sampling_defaults
    from specray.kernels.config import ModelConfig
    from specray.kernels.drafters.loading import check_draft, refuse_partial_draft
    from specray.kernels.loader import is_diffusion_model, resolve

    checkpoint = resolve(cfg.model)
    refuse_partial_draft(checkpoint.path, cfg.model)
    r = cfg.router
    runtime_sampling_defaults(cfg, checkpoint.path)  # a file every request would fail on
    if is_diffusion_model(cfg.model):  # its context and block against the model's config
        from specray.cluster.router.diffusion_router import diffusion_limits
        from specray.kernels.diffusion.weights import read_config

        diffusion_limits(read_config(checkpoint.path), cfg.decode_options().block_length, r.max_model_len, r.max_num_seqs)
        return
    limit = ModelConfig.from_hf(checkpoint.hf_config()).max_position_embeddings
    fit_context(r.max_model_len, limit, num_blocks(r.kv_cache_tokens, r.block_size) * r.block_size, cfg.speculative)
    check_draft(checkpoint.path, cfg.speculative)


def cmd_serve(args) -> int:
    import yaml

    cfg = resolve_config(args)
    if args.dry_run:
        shown = cfg.model_dump()
        if shown["http"]["api_key"]:
            shown["http"]["api_key"] = "<hidden>"
        print(yaml.safe_dump(shown, sort_keys=False), end="")
        return 0
    if args.api_key:
        print("specray serve: --api-key is visible in the process list; prefer --api-key-file or SPECRAY_API_KEY",
              file=sys.stderr)
    cfg.http.resolved_api_key()  # an unreadable key file fails here, before anything starts
    # SIGTERM (docker stop, kill, a supervisor) stops it as Ctrl-C does, while it checks and deploys
    # too: Ray's driver would otherwise print a crash trace and abort (exit 134) with requests in flight
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        if cfg.ray_address is None:  # a local cluster's workers see this machine's files, and listen here
            from specray.cluster.serve.ports import check_drafter, check_listening

            cfg.grpc.tls_pair()  # files that cannot be read, or a key that is not the certificate's
            check_listening(cfg)
            check_model_and_context(cfg)
            check_drafter(cfg)
        from specray.cluster.serve.local_ray import start_ray
        from specray.cluster.serve.run import run_serve

        start_ray(cfg)
        signal.signal(signal.SIGTERM, _interrupt)  # again: ray.init installs a handler of its own
        handle = run_serve(cfg)
        print(endpoint_banner(cfg, handle), flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("specray serve: shutting down", file=sys.stderr)
        _stop_serve(cfg)
        return 0
    except RuntimeError as e:  # the replica failed to start: Serve's error holds its whole traceback
        reason = (str(e).strip().splitlines() or ["unknown error"])[-1]
        print(f"specray serve: the deployment failed: {reason} (the replica's log has the rest)", file=sys.stderr)
        _stop_serve(cfg)
        return 1


def _stop_serve(cfg) -> None:
    """Ends what this process deployed: on a cluster it joined, its own application only."""
    import ray

    if not ray.is_initialized():
        return
    from ray import serve

    if cfg.ray_address:
        serve.delete("specray")
    else:
        serve.shutdown()


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
