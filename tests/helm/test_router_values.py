"""The chart's router values as the serve config receives them."""

import pytest
from helm_checks import app_config
from specray.cluster.config.serve import ServeConfig


@pytest.mark.parametrize("value, device, budgets", [("auto", "cpu", (256, 64)), ("auto", "cuda", (512, None)),
                                                    (300, "cuda", (300, None)), (None, "cpu", (None, None))])
def test_prefill_budget_renders_as_given(value, device, budgets):
    """maxPrefillTokens: auto (the default) follows the target's device where the router is built
    (alone, and beside decoding sequences); a number passes as it is; null prefills every prompt whole."""
    from helm_render import render

    from specray.cluster.config.defaults import resolve_prefill_tokens

    values = {"target": {"gpus": 0}} if device == "cpu" else {}  # no GPUs: the workers' device is cpu
    cfg = app_config(render({**values, "router": {"maxPrefillTokens": value}}).rayservice)
    assert cfg["pools"]["target"].get("device", "cpu") == device
    assert cfg["router"]["max_prefill_tokens"] == value
    served = ServeConfig.from_dict(cfg)
    assert resolve_prefill_tokens(served.router.max_prefill_tokens, served.pools.target.device) == budgets


@pytest.mark.parametrize("value", [True, False])
def test_prefix_caching_renders_as_given(value):
    from helm_render import render

    cfg = app_config(render({"router": {"enablePrefixCaching": value}}).rayservice)
    assert cfg["router"]["enable_prefix_caching"] is value
    assert ServeConfig.from_dict(cfg).router.enable_prefix_caching is value


def test_prefix_caching_is_on_by_default():
    from helm_render import render

    assert app_config(render({}).rayservice)["router"]["enable_prefix_caching"] is True
