"""`specray serve`'s draft transport and local cluster: where the draft runs (inline in the
router's process or a pool of its own) and what a local Ray cluster advertises and inherits."""

import os

import pytest

from specray.cluster.cli import main


def test_inline_transport_places_no_draft_actor():
    """transport inline: the draft worker lives in the router, so a local cluster advertises only
    what the target pool needs."""
    from specray.cluster.config.serve import ServeConfig
    from specray.cluster.serve.local_ray import local_resources

    pools = {"draft": {"resources": {"draft": 1}}, "target": {"resources": {"target": 1}}}
    ray_cfg = ServeConfig.from_dict({"pools": pools, "transport": {"kind": "ray"}})
    inline_cfg = ServeConfig.from_dict({"pools": pools, "transport": {"kind": "inline"}})
    assert local_resources(ray_cfg) == {"draft": 1, "target": 1}
    assert local_resources(inline_cfg) == {"target": 1}
    assert main(["serve", "--transport", "inline", "--dry-run"]) == 0


def test_a_cluster_of_its_own_reconciles_less_often(monkeypatch):
    """A local cluster gets LOCAL_CLUSTER_ENV before Ray starts (its processes inherit it), unless
    the user set the variable; a cluster specray joins is left as it is."""
    import ray

    from specray.cluster.config.serve import ServeConfig
    from specray.cluster.serve.local_ray import start_ray

    name, seen = "RAY_SERVE_CONTROL_LOOP_INTERVAL_S", []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.append((kw["address"], os.environ.get(name))))
    monkeypatch.delenv(name, raising=False)
    start_ray(ServeConfig.from_dict({}))
    monkeypatch.setenv(name, "0.2")
    start_ray(ServeConfig.from_dict({}))
    monkeypatch.delenv(name)
    start_ray(ServeConfig.from_dict({"ray_address": "auto"}))
    assert seen == [("local", "0.5"), ("local", "0.2"), ("auto", None)]


@pytest.mark.parametrize("speculative, resolved", [
    ({"method": "ngram"}, "inline"), ({"method": "aded"}, "inline"),
    ({"method": "draft_model", "model": "smollm2-135m"}, "ray"), (None, "ray"),
    ({"num_speculative_tokens": 3}, "inline")])  # no method: n-gram, as vLLM's
def test_auto_transport_runs_model_free_drafts_inline(speculative, resolved):
    """transport auto (the default): a draft without a model (n-gram, ADED) runs in the router's
    process, where a round's proposal costs no hop to another process; a draft model gets its pool."""
    from specray.cluster.config.serve import ServeConfig
    from specray.cluster.serve.local_ray import local_resources

    pools = {"draft": {"resources": {"draft": 1}}, "target": {"resources": {"target": 1}}}
    cfg = ServeConfig.from_dict({"pools": pools, "speculative_config": speculative})
    assert cfg.transport.kind == "auto" and cfg.draft_transport == resolved
    expected = {"target": 1} if resolved == "inline" or speculative is None else {"draft": 1, "target": 1}
    assert local_resources(cfg) == expected
    explicit = ServeConfig.from_dict({"pools": pools, "speculative_config": speculative, "transport": {"kind": "ray"}})
    assert explicit.draft_transport == "ray"
