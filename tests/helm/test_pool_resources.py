"""The worker groups advertise exactly the Ray resources the Serve config's pools request; the target
pool's other settings reach the Serve config."""

import copy

import pytest
from helm_checks import app_config, pool_resource_problems, ray_resources_param, with_app_config
from helm_scenarios import SCENARIOS

from specray.cluster.config.serve import ServeConfig


def _group(rayservice, name):
    (g,) = [g for g in rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"] if g["groupName"] == name]
    return g


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_groups_and_pools_agree(rendered, scenario):
    assert pool_resource_problems(rendered[scenario].rayservice) == []


def test_kuberay_quoting_of_resources(rendered):
    rayservice = rendered["eagle"].rayservice
    value = _group(rayservice, "draft")["rayStartParams"]["resources"]
    assert value == '"{\\"draft\\":1}"'  # YAML '"{\"draft\":1}"', as in KubeRay's samples
    assert ray_resources_param(value) == {"draft": 1} == app_config(rayservice)["pools"]["draft"]["resources"]
    assert ray_resources_param(_group(rayservice, "target")["rayStartParams"]["resources"]) == {"target": 1}


def test_drifted_group_resources_are_caught(rendered):
    rayservice = copy.deepcopy(rendered["eagle"].rayservice)
    _group(rayservice, "draft")["rayStartParams"]["resources"] = '"{\\"drafter\\": 1}"'
    problems = pool_resource_problems(rayservice)
    assert problems == ["pool draft: group advertises {'drafter': 1}, config requests {'draft': 1.0}"]


def test_drifted_config_resources_are_caught(rendered):
    def drift(cfg):
        cfg["pools"]["target"]["resources"] = {"target": 2}
    problems = pool_resource_problems(with_app_config(rendered["default"].rayservice, drift))
    assert problems == ["pool target: group advertises {'target': 1}, config requests {'target': 2.0}"]


def test_workers_inside_the_replica_are_caught(rendered):
    assert app_config(rendered["default"].rayservice)["pools"]["colocate"] is False

    def drift(cfg):
        cfg["pools"]["colocate"] = "auto"
    problems = pool_resource_problems(with_app_config(rendered["default"].rayservice, drift))
    assert problems == ["pools.colocate is 'auto': the chart's pools run in their own pods"]


def test_too_few_target_pods_for_tensor_parallel_are_caught(rendered):
    def drift(cfg):
        cfg["pools"]["target"]["num_workers"] = 2
    problems = pool_resource_problems(with_app_config(rendered["default"].rayservice, drift))
    assert problems == ["pool target: 2 workers need 2 pods, group has replicas=1"]


def test_missing_gpu_and_shared_resources_are_caught(rendered):
    rayservice = copy.deepcopy(rendered["eagle"].rayservice)
    del _group(rayservice, "target")["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    _group(rayservice, "draft")["rayStartParams"]["resources"] = '"{\\"draft\\": 1, \\"target\\": 1}"'
    problems = pool_resource_problems(rayservice)
    assert "pool target: a worker reserves 1.0 GPU, a pod has 0.0" in problems
    assert "pool target: draft also advertises ['target']" in problems


def test_missing_draft_group_is_caught(rendered):
    rayservice = copy.deepcopy(rendered["eagle"].rayservice)
    groups = rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    groups[:] = [g for g in groups if g["groupName"] != "draft"]
    assert pool_resource_problems(rayservice) == ["pool draft: no worker group named 'draft'"]


def test_draft_group_without_speculation_is_caught(rendered):
    def drift(cfg):
        cfg["speculative_config"] = None
    problems = pool_resource_problems(with_app_config(rendered["eagle"].rayservice, drift))
    assert problems == ["a draft worker group is rendered but speculative_config is null"]


@pytest.mark.parametrize("mode", ["fast", "fast16"])
def test_target_kernels_reach_the_serve_config(mode):
    """target.kernels: the target pool's CPU kernel mode (auto by default, fast or fast16 on request)."""
    from helm_render import render

    assert ServeConfig.from_dict(app_config(render({}).rayservice)).pools.target.kernels == "auto"
    cpu = {"gpus": 0, "dtype": "float32"}
    cfg = app_config(render({"target": {**cpu, "kernels": mode}}).rayservice)
    assert cfg["pools"]["target"]["kernels"] == mode and ServeConfig.from_dict(cfg).pools.target.kernels == mode
    # a fast mode where it would do nothing (a GPU, bf16 weights) is refused by the server: the chart
    # rendered it, and the RayService retried a config the server refused (tests/helm/test_values_errors.py)
    with pytest.raises(ValueError, match=f"kernels '{mode}' is a CPU kernels' mode"):
        ServeConfig.from_dict({**cfg, "pools": {**cfg["pools"], "target": {**cfg["pools"]["target"], "device": "cuda"}}})
