"""What each configuration renders: groups, GPUs, API key wiring, storage, NOTES (traffic: test_services.py)."""

import pytest

from helm_checks import app_config, kuberay_serve_service, serve_deploy_config

from specray.cluster.config.serve import ServeConfig

RAY_CONTAINERS = ("ray-head", "ray-draft", "ray-target")


def _groups(r):
    return {g["groupName"]: g for g in r.rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]}


def _containers(r):
    cluster = r.rayservice["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    return [c for p in pods for c in p["spec"]["containers"]]


def test_default_is_gpu_target_with_the_targets_own_speculation(rendered):
    r = rendered["default"]
    assert set(_groups(r)) == {"target"}  # adaptive n-gram drafts in the replica
    target = _groups(r)["target"]["template"]["spec"]["containers"][0]
    assert target["resources"]["limits"]["nvidia.com/gpu"] == 1
    cfg = app_config(r.rayservice)
    assert cfg["pools"]["target"]["device"] == "cuda" and cfg["pools"]["target"]["num_gpus"] == 1
    assert "speculative_config" not in cfg  # method default: the Serve config picks the target's own
    assert ServeConfig.from_dict(cfg).speculative_config["method"] == "ngram"
    assert ServeConfig.from_dict(cfg).draft_transport == "inline"
    assert cfg["http"]["api_key_env"] is None  # no key: a stray variable must not turn auth on
    assert r.of_kind("Secret") == [] and r.of_kind("ServiceMonitor") == []
    eagle = rendered["eagle"]
    draft = _groups(eagle)["draft"]["template"]["spec"]["containers"][0]  # a neural draft beside a GPU target
    assert draft["resources"]["limits"]["nvidia.com/gpu"] == 1
    cfg = app_config(eagle.rayservice)
    assert cfg["pools"]["draft"]["num_gpus"] == 1 and cfg["pools"]["draft"]["device"] == "cuda"


def test_ngram_draft_group_gets_no_gpu():
    from helm_render import render

    r = render({"speculation": {"method": "ngram"}, "transport": {"kind": "ray"}})
    draft = _groups(r)["draft"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in (draft["resources"].get("limits") or {})
    assert app_config(r.rayservice)["pools"]["draft"]["num_gpus"] == 0


@pytest.mark.parametrize("values", [{"speculation": {"method": "ngram"}}, {"speculation": {"method": "aded"}},
                                    {"target": {"gpus": 0}}, {"transport": {"kind": "inline"}}])
def test_a_draft_in_the_replica_renders_no_draft_group(values):
    """transport auto (the default) drafts inside the replica where the method has no draft model
    (ngram, aded, the default); inline always does. Neither renders a draft group."""
    from helm_render import render

    r = render(values)
    cfg = ServeConfig.from_dict(app_config(r.rayservice))
    assert "draft" not in _groups(r) and cfg.draft_transport == "inline"
    assert render({**values, "draft": {"enabled": False}}).rayservice  # nothing left for the group to hold


def test_an_inline_model_draft_runs_on_the_cpu():
    """Inline, a model draft runs in the Serve replica, which reserves no GPU: it was sent to CUDA."""
    from helm_render import render

    r = render({"speculation": {"method": "eagle", "draftModel": "smollm2-135m-eagle"}, "transport": {"kind": "inline"}})
    draft = app_config(r.rayservice)["pools"]["draft"]
    assert "draft" not in _groups(r) and draft["num_gpus"] == 0 and draft["device"] == "cpu"


def test_a_grpc_drafter_renders_no_draft_group():
    """The draft pool is the external Drafter: a draft group held a GPU for nothing."""
    from helm_render import render

    r = render({"speculation": {"method": "eagle", "draftModel": "d"},
                "transport": {"kind": "grpc", "drafterAddress": "drafter:50051"}})
    assert set(_groups(r)) == {"target"} and ServeConfig.from_dict(app_config(r.rayservice)).draft_transport == "grpc"


def test_layer_parallel_draft_group_of_workers():
    """draft.groupSize workers, one per pod and GPU, split each layer group's attentions (EasySpec)."""
    from helm_render import render

    r = render({"speculation": {"method": "draft_model", "draftModel": "d", "layerParallel": 4},
                "draft": {"groupSize": 4, "replicas": 4, "maxReplicas": 4}})
    cfg = app_config(r.rayservice)
    assert cfg["pools"]["draft"]["num_workers"] == 4 and cfg["pools"]["draft"]["num_gpus"] == 1
    assert _groups(r)["draft"]["replicas"] == 4
    assert ServeConfig.from_dict(cfg).pools.draft.num_workers == 4


def test_cpu_profile_has_no_gpus(rendered):
    r = rendered["cpu"]
    assert all("nvidia.com/gpu" not in (c.get("resources", {}).get("limits") or {}) for c in _containers(r))
    cfg = app_config(r.rayservice)
    assert cfg["model"] == "smollm2-135m"
    assert {cfg["pools"][name]["device"] for name in ("target", "draft")} == {"cpu"}
    assert {cfg["pools"][name]["num_gpus"] for name in ("target", "draft")} == {0}
    assert "tolerations" not in _groups(r)["target"]["template"]["spec"]


def test_tensor_parallel_target(rendered):
    r = rendered["tp2"]
    assert app_config(r.rayservice)["pools"]["target"]["num_workers"] == 2
    assert _groups(r)["target"]["replicas"] == 2


def test_no_draft_group_when_speculation_is_off(rendered):
    r = rendered["no-draft"]
    assert set(_groups(r)) == {"target"}
    assert app_config(r.rayservice)["speculative_config"] is None


def test_api_key_from_chart_secret_on_every_ray_container(rendered):
    r = rendered["api-key"]
    secret = r.one("Secret")
    assert secret["data"] == {"api-key": "czNjcmV0"}  # base64("s3cret")
    for c in _containers(r):
        (env,) = [e for e in c["env"] if e["name"] == "SPECRAY_API_KEY"]
        assert env["valueFrom"]["secretKeyRef"] == {"name": secret["metadata"]["name"], "key": "api-key"}
    assert app_config(r.rayservice)["http"]["api_key_env"] == "SPECRAY_API_KEY"
    assert "s3cret" not in r.rayservice["spec"]["serveConfigV2"]
    assert 'Authorization: Bearer $SPECRAY_API_KEY' in r.notes


def test_existing_secret_monitoring_and_init_container(rendered):
    r = rendered["everything"]
    assert r.of_kind("Secret") == []
    assert {c["env"][0]["valueFrom"]["secretKeyRef"]["name"] for c in _containers(r)} == {"my-key"}
    monitor = r.one("ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    http = kuberay_serve_service(r.rayservice)
    assert monitor["spec"]["selector"]["matchLabels"].items() <= http["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] in [p["name"] for p in http["spec"]["ports"]]
    head = r.rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    assert head["initContainers"][0]["volumeMounts"] == [{"name": "models", "mountPath": "/models"}]
    assert {"name": "models", "emptyDir": {"sizeLimit": "50Gi"}} in head["volumes"]
    assert head["containers"][0]["readinessProbe"] == {"exec": {"command": ["true"]}}
    assert r.rayservice["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is True
    cfg = app_config(r.rayservice)
    assert cfg["transport"] == {"kind": "torch_distributed", "master_port": 29500}
    assert cfg["router"]["max_num_seqs"] == 4 and cfg["router"]["max_waiting"] == 256  # deep merge
    assert cfg["router"]["max_prefill_tokens"] == "auto"
    assert cfg["served_model_name"] == "m"


def test_draft_model_from_a_created_claim(rendered):
    r = rendered["draft-model"]
    claim = r.one("PersistentVolumeClaim")
    spec = app_config(r.rayservice)["speculative_config"]
    assert spec["method"] == "draft_model" and spec["model"] == "/models/draft"
    for g in _groups(r).values():
        vols = {v["name"]: v for v in g["template"]["spec"]["volumes"]}
        assert vols["models"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]


def test_external_grpc_drafter_without_draft_group_or_grpc_api(rendered):
    r = rendered["grpc-drafter"]
    assert set(_groups(r)) == {"target"}
    assert app_config(r.rayservice)["transport"] == {"kind": "grpc", "drafter_address": "drafter:50051"}
    assert "grpc_options" not in serve_deploy_config(r.rayservice)
    assert [p["name"] for p in kuberay_serve_service(r.rayservice)["spec"]["ports"]] == ["serve"]


def test_a_gpu_draft_tolerates_the_gpu_taint(rendered):
    """draft.gpus null gives a model draft beside a GPU target a GPU, but the draft tolerated nothing while
    the target tolerates nvidia.com/gpu: on tainted GPU nodes the draft pod stayed Pending."""
    from helm_render import render

    target = _groups(rendered["eagle"])["target"]["template"]["spec"]["tolerations"]
    draft = _groups(rendered["eagle"])["draft"]["template"]["spec"]
    assert draft["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert draft["tolerations"] == target == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    explicit = render({"speculation": {"method": "ngram"}, "transport": {"kind": "ray"}, "draft": {"gpus": 2}})
    assert _groups(explicit)["draft"]["template"]["spec"]["tolerations"] == target
    own = [{"key": "pool", "operator": "Equal", "value": "draft", "effect": "NoSchedule"}]
    mine = render({"speculation": {"method": "eagle", "draftModel": "d"}, "draft": {"tolerations": own}})
    assert _groups(mine)["draft"]["template"]["spec"]["tolerations"] == own  # a list of one's own replaces it
    no_gpu = render({"speculation": {"method": "ngram"}, "transport": {"kind": "ray"}})
    assert "tolerations" not in _groups(no_gpu)["draft"]["template"]["spec"]
    assert "tolerations" not in _groups(rendered["draft-model"])["draft"]["template"]["spec"]  # CPU profile


def test_explicit_eagle_draft():
    """method eagle names its feature-level draft like draft_model; the rendered config validates."""
    from helm_render import render

    r = render({"speculation": {"method": "eagle", "draftModel": "smollm2-135m-eagle", "numSpeculativeTokens": 1,
                                "disableByBatchSize": 2}}, files=("values-cpu.yaml",))
    cfg = app_config(r.rayservice)
    assert cfg["speculative_config"] == {"method": "eagle", "model": "smollm2-135m-eagle",
                                         "num_speculative_tokens": 1, "disable_by_batch_size": 2}
    assert ServeConfig.from_dict(cfg).speculative_config == cfg["speculative_config"]
    r = render({"speculation": {"method": "eagle", "draftModel": "smollm2-135m-eagle", "numSpeculativeTokens": 4,
                                "adaptive": True}}, files=("values-cpu.yaml",))
    cfg = app_config(r.rayservice)
    assert cfg["speculative_config"]["adaptive"] is True and cfg["speculative_config"]["num_speculative_tokens"] == 4
    assert ServeConfig.from_dict(cfg).speculative_config == cfg["speculative_config"]


def test_longspec_draft():
    """method longspec names its draft folder; longspecWindow becomes speculative_config.longspec.window."""
    from helm_render import render

    r = render({"speculation": {"method": "longspec", "draftModel": "/models/longspec", "longspecWindow": 256}},
               files=("values-cpu.yaml",))
    cfg = app_config(r.rayservice)
    assert cfg["speculative_config"] == {"method": "longspec", "model": "/models/longspec", "num_speculative_tokens": 2,
                                         "longspec": {"window": 256}}
    assert ServeConfig.from_dict(cfg).speculative.longspec == {"window": 256}


def test_aded_draft():
    """method aded renders a config the server accepts (ADED drafts over the target's tokenizer)."""
    from helm_render import render

    cfg = app_config(render({"speculation": {"method": "aded"}}, files=("values-cpu.yaml",)).rayservice)
    assert cfg["speculative_config"]["method"] == "aded"
    assert ServeConfig.from_dict(cfg).speculative.method == "aded"


def test_layer_parallel_draft():
    """speculation.layerParallel (EasySpec) becomes speculative_config.layer_parallel; it validates."""
    from helm_render import render

    r = render({"speculation": {"method": "draft_model", "draftModel": "smollm2-135m-draft", "layerParallel": 3}},
               files=("values-cpu.yaml",))
    cfg = app_config(r.rayservice)
    assert cfg["speculative_config"]["layer_parallel"] == 3
    assert ServeConfig.from_dict(cfg).speculative.layer_parallel == 3


def test_a_trained_drafts_blocks_and_vocab_trim():
    """speculation.draftQuantization and draftVocabTrim become the speculative_config keys; unset, the
    server's defaults stand (no key); 0 turns VocabTrim off."""
    from helm_render import render

    spec = {"method": "eagle", "draftModel": "smollm2-135m-eagle"}
    r = render({"speculation": {**spec, "draftQuantization": "q4_1", "draftVocabTrim": 4096}}, files=("values-cpu.yaml",))
    cfg = app_config(r.rayservice)
    assert cfg["speculative_config"]["draft_quantization"] == "q4_1"
    assert cfg["speculative_config"]["draft_vocab_trim"] == 4096
    assert ServeConfig.from_dict(cfg).speculative.draft_quantization == "q4_1"
    off = app_config(render({"speculation": {**spec, "draftVocabTrim": 0}}, files=("values-cpu.yaml",)).rayservice)
    assert off["speculative_config"]["draft_vocab_trim"] == 0
    unset = app_config(render({"speculation": spec}, files=("values-cpu.yaml",)).rayservice)
    assert "draft_quantization" not in unset["speculative_config"] and "draft_vocab_trim" not in unset["speculative_config"]


def test_trees_through_config_overrides():
    """speculation keys the values do not cover (a tree, its verify budget, lookup first) reach the
    Serve config through serve.configOverrides, merged into the rendered speculative_config."""
    from helm_render import render

    extra = {"tree": {"kind": "topk", "k": 3, "width": 4}, "verify_budget": 24, "lookup_first": True}
    r = render({"speculation": {"method": "eagle", "draftModel": "smollm2-135m-eagle", "numSpeculativeTokens": 4},
                "serve": {"configOverrides": {"speculative_config": extra}}}, files=("values-cpu.yaml",))
    cfg = app_config(r.rayservice)
    assert cfg["speculative_config"] == {"method": "eagle", "model": "smollm2-135m-eagle",
                                         "num_speculative_tokens": 4, **extra}
    assert ServeConfig.from_dict(cfg).speculative_config == cfg["speculative_config"]


def test_diffusion_lm_with_freedave():
    """method freedave serves a diffusion LM: num_drafts and the blocks render into a config the server
    accepts, and no draft worker group is rendered (FreeDave drafts from the model itself)."""
    from helm_render import render

    r = render({"model": {"target": "smollm2-135m-dllm"}, "speculation": {"method": "freedave", "numDrafts": 3},
                "diffusion": {"blockLength": 16, "stepsPerBlock": 8}}, files=("values-cpu.yaml",))
    cfg = app_config(r.rayservice)
    assert cfg["speculative_config"] == {"method": "freedave", "num_drafts": 3, "adaptive": True}
    assert cfg["diffusion_config"] == {"block_length": 16, "steps_per_block": 8}
    options = ServeConfig.from_dict(cfg).decode_options()
    assert (options.num_drafts, options.block_length, options.steps) == (3, 16, 8)
    assert "draft" not in _groups(r)
