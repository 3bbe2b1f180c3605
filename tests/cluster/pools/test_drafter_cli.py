"""`specray drafter`: the external draft pool takes the router's speculative options (trees, ADED,
VocabTrim), validates them the same way, and serves tree proposals over gRPC."""

import pytest

from specray.actors.messages import DraftItem, SeqSpec
from specray.cluster.cli import build_parser, main
from specray.cluster.serve.drafter_cli import drafter_spec
from specray.kernels.sampling import SamplingConfig


def test_drafter_serves_trees_over_grpc(tiny_draft):
    from specray.cluster.pools.draft_endpoint import DraftEndpoint
    from specray.cluster.pools.grpc_transport import GrpcDraftPool, serve_drafter

    args = build_parser().parse_args(["drafter", "--method", "draft_model", "--model", str(tiny_draft),
                                      "--tree", '{"kind": "rsd_c", "branching": [2, 1]}'])
    spec = drafter_spec(args)
    assert spec.tree == {"kind": "rsd_c", "branching": [2, 1]}
    server, port = serve_drafter(DraftEndpoint.from_spec(spec), "127.0.0.1:0")
    pool = GrpcDraftPool(f"127.0.0.1:{port}")
    try:
        pool.ready(timeout_s=30)
        item = DraftItem("s", [1, 5, 9, 12], 2, SeqSpec(SamplingConfig(temperature=1.0), seed=3))
        (proposal,) = pool.submit_propose([item]).result()
        assert proposal.is_tree and proposal.num_draft_tokens == 4  # two roots, one child each
        assert proposal.tree_parents() == [-1, -1, 0, 1]
    finally:
        pool.close()
        server.stop(grace=0)


@pytest.mark.parametrize("flags, message", [
    (["--method", "draft_model", "--model", "d", "--tree", '{"kind": "oak"}'], "oak"),
    (["--method", "ngram", "--tree", '{"kind": "rsd_c", "branching": [2]}'], "needs method 'draft_model'"),
    (["--method", "aded"], "needs --model"),
    (["--method", "ngram", "--layer-parallel", "2"], "'layer_parallel' needs method 'draft_model'"),
    (["--method", "longspec", "--model", "d", "--longspec", '{"window": 0}'], "longspec window must be"),
    (["--method", "ngram", "--longspec", '{"window": 8}'], "'longspec' options need method 'longspec'"),
])
def test_bad_drafter_options_exit_2_with_the_reason(capsys, flags, message):
    assert main(["drafter", *flags]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("flag, value", [("--vocab-trim", "-1"), ("--layer-parallel", "0"), ("--num-layers", "0"),
                                         ("--kv-cache-tokens", "0")])
def test_bad_drafter_numbers_are_refused_when_parsed(capsys, flag, value):
    with pytest.raises(SystemExit) as e:
        main(["drafter", "--method", "draft_model", "--model", "d", flag, value])
    assert e.value.code == 2 and f"argument {flag}: expected an integer" in capsys.readouterr().err


def test_an_aded_drafter_takes_the_targets_tokenizer(tiny_target):
    """`--method aded --model TARGET`: the model is the target whose tokenizer the tri-gram table
    uses, not a draft (the speculative config's check refused it, so no ADED drafter could start)."""
    from specray.cluster.pools.draft_endpoint import DraftEndpoint

    spec = drafter_spec(build_parser().parse_args(["drafter", "--method", "aded", "--model", str(tiny_target)]))
    assert spec.method == "aded" and spec.model == str(tiny_target)
    assert DraftEndpoint.from_spec(spec) is not None


def test_a_drafter_with_dtype_auto_gets_float32(tiny_draft):
    """vLLM's `auto` passed the check and reached the worker raw (a KeyError there)."""
    args = build_parser().parse_args(["drafter", "--method", "draft_model", "--model", str(tiny_draft),
                                      "--dtype", "auto"])
    assert drafter_spec(args).dtype == "float32"


def test_tree_flag_must_be_a_json_object(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["drafter", "--tree", "[1, 2]"])
    assert "expected a JSON object" in capsys.readouterr().err


def test_drafter_serves_a_longspec_draft_over_grpc(tiny_longspec):
    """The external pool builds a LongSpec draft with its window option and drafts from the target
    KV rows the item carries."""
    import torch

    from specray.cluster.pools.draft_endpoint import DraftEndpoint
    from specray.cluster.pools.grpc_transport import GrpcDraftPool, serve_drafter

    args = build_parser().parse_args(["drafter", "--method", "longspec", "--model", str(tiny_longspec),
                                      "--longspec", '{"window": 4}'])
    spec = drafter_spec(args)
    assert spec.longspec == {"window": 4}
    endpoint = DraftEndpoint.from_spec(spec)
    server, port = serve_drafter(endpoint, "127.0.0.1:0")
    pool = GrpcDraftPool(f"127.0.0.1:{port}")
    try:
        pool.ready(timeout_s=30)
        item = DraftItem("s", [1, 5, 9, 12, 7, 8], 3, SeqSpec(SamplingConfig(temperature=0.0)),
                         features=torch.randn(5, 2 * 2 * 16))
        (proposal,) = pool.submit_propose([item]).result()
        assert len(proposal.draft_token_ids) == 3
    finally:
        pool.close()
        server.stop(grace=0)


def test_serve_refuses_a_drafter_that_is_not_there_or_serves_another_method(tiny_target, capsys, monkeypatch):
    """A wrong address held the replica five minutes, then Serve retried it forever; a drafter of
    another method drafted unnoticed (its ping named its method, unread)."""
    import specray.cluster.serve.local_ray as local_ray
    import specray.cluster.serve.ports as ports
    from specray.actors.specs import DraftSpec
    from specray.cluster.pools.draft_endpoint import DraftEndpoint
    from specray.cluster.pools.grpc_transport import serve_drafter
    from specray.cluster.serve.http_server import free_port

    monkeypatch.setattr(local_ray, "start_ray", lambda cfg: pytest.fail("Ray must not start"))
    monkeypatch.setattr(ports, "DRAFTER_WAIT_S", 1.0)
    server, port = serve_drafter(DraftEndpoint.from_spec(DraftSpec("ngram", None, threads=1)), "127.0.0.1:0")
    serve = ["serve", "--model", str(tiny_target), "--port", str(free_port()), "--grpc-port", str(free_port()),
             "--transport", "grpc"]
    try:
        assert main([*serve, "--drafter-address", f"127.0.0.1:{free_port()}", "--speculative-method", "ngram"]) == 2
        assert "no specray drafter answers at 127.0.0.1:" in capsys.readouterr().err
        assert main([*serve, "--drafter-address", f"127.0.0.1:{port}", "--speculative-method", "aded"]) == 2
        assert "serves method 'ngram'; speculative_config asks for 'aded'" in capsys.readouterr().err
    finally:
        server.stop(grace=0)


@pytest.mark.parametrize("config", [
    {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 3},
    {"method": "draft_model", "tree": {"kind": "rsd_c", "branching": [2, 1]}, "draft_vocab_trim": 0,
     "draft_quantization": "none", "draft_num_layers": 1, "lookup_first": True},
    {"method": "aded", "aded": {"simulations": 3}},
])
def test_drafter_argv_serves_what_the_router_would(config, tiny_target, tiny_draft):
    """`bench cluster`'s gRPC row started its drafter with --method and --model only: trees, VocabTrim,
    lookup and ADED's target went missing, so that row drafted differently from the others."""
    from specray.cluster.config.speculative import SpeculativeConfig
    from specray.cluster.config.worker_specs import draft_spec
    from specray.cluster.serve.drafter_cli import DRAFTER_BLOCK_SIZE, drafter_argv

    if config["method"] == "draft_model":
        config = {**config, "model": str(tiny_draft)}
    spec = SpeculativeConfig.from_dict(config)
    served = drafter_spec(build_parser().parse_args(["drafter", *drafter_argv(spec, str(tiny_target))]))
    want = draft_spec(spec, str(tiny_target), "float32", "cpu", 16384, DRAFTER_BLOCK_SIZE)
    assert served == want
