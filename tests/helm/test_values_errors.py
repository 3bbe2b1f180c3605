"""Bad values fail the render with a message that names the key (schema) or the fix (templates)."""

import helm_python
import pytest
from helm_render import render


@pytest.mark.parametrize("values, message", [
    ({"target": {"replicas": -1}}, "at '/target/replicas': minimum: got -1, want 0"),
    ({"draft": {"minReplicas": -2}}, "at '/draft/minReplicas': minimum: got -2, want 0"),
    ({"speculation": {"method": "medusa"}},
     "at '/speculation/method': value must be one of 'default', 'ngram', 'draft_model', 'eagle', 'longspec', 'aded', 'freedave', 'none'"),
    ({"transport": {"kind": "nccl"}},
     "at '/transport/kind': value must be one of 'auto', 'ray', 'torch_distributed', 'grpc', 'inline'"),
    ({"target": {"tensorParalel": 2}}, "additional properties 'tensorParalel' not allowed"),
    ({"draft": {"rayStartParams": {"num-cpus": 2}}}, "at '/draft/rayStartParams/num-cpus': got number, want string"),
    ({"target": {"rayResources": {"target": 0}}}, "at '/target/rayResources/target'"),
    ({"speculation": {"layerParallel": 0}}, "at '/speculation/layerParallel': minimum: got 0, want 1"),
    ({"speculation": {"draftQuantization": "int4"}}, "/speculation/draftQuantization"),
    ({"speculation": {"draftVocabTrim": -1}}, "at '/speculation/draftVocabTrim': minimum: got -1, want 0"),
    ({"speculation": {"longspecWindow": 0}}, "at '/speculation/longspecWindow': minimum: got 0, want 1"),
    ({"router": {"maxPrefillTokens": 0}}, "at '/router/maxPrefillTokens'"),
    ({"apiKey": {"secretKey": "api key"}}, "at '/apiKey/secretKey'"),  # not a Secret data key
    ({"target": {"rayResources": {"GPU": 1}}}, "invalid propertyName 'GPU'"),  # Ray refuses its own names
    # each rendered and was refused by the server at deploy time, the RayService retrying
    ({"speculation": {"numSpeculativeTokens": 1000}}, "at '/speculation/numSpeculativeTokens': maximum: got 1,000, want 256"),
    ({"serve": {"proxyLocation": "Disabled"}}, "at '/serve/proxyLocation'"),  # no proxy: nothing served
])
def test_schema_rejects(values, message):
    with pytest.raises(helm_python.HelmValuesError) as e:
        render(values)
    assert message in str(e.value)
    assert "values don't meet the specifications of the schema" in str(e.value)


@pytest.mark.parametrize("values, message", [
    ({"speculation": {"method": "draft_model"}}, "speculation.method draft_model needs speculation.draftModel"),
    ({"speculation": {"method": "eagle"}}, "speculation.method eagle needs speculation.draftModel"),
    ({"speculation": {"method": "longspec"}}, "speculation.method longspec needs speculation.draftModel"),
    ({"speculation": {"method": "longspec", "draftModel": "d"},
      "target": {"tensorParallel": 2, "replicas": 2, "minReplicas": 2, "maxReplicas": 2}},
     "longspec reads the target's whole last-layer KV: set target.tensorParallel to 1"),
    ({"speculation": {"method": "ngram", "layerParallel": 2}},
     "speculation.layerParallel needs speculation.method draft_model"),
    ({"draft": {"groupSize": 2, "replicas": 2, "maxReplicas": 2}}, "draft.groupSize 2 needs speculation.layerParallel >= 2"),
    ({"speculation": {"method": "draft_model", "draftModel": "d", "layerParallel": 2}, "draft": {"groupSize": 2}},
     "draft.replicas (1) must be at least draft.groupSize (2)"),
    ({"target": {"tensorParallel": 2}}, "target.replicas (1) must be at least target.tensorParallel (2)"),
    ({"draft": {"replicas": 3}}, "draft: need minReplicas <= replicas <= maxReplicas, got 1, 3, 1"),
    ({"transport": {"kind": "grpc"}}, "transport.kind grpc needs transport.drafterAddress"),
    ({"speculation": {"method": "eagle", "draftModel": "d"}, "draft": {"enabled": False}},
     "draft.enabled=false leaves the draft pool nowhere to run"),
    ({"apiKey": {"enabled": True}}, "apiKey.enabled needs apiKey.value or apiKey.existingSecret"),
    ({"speculation": {"method": "aded", "adaptive": True}}, "speculation.adaptive applies to chains"),
    ({"http": {"port": 9000}}, "http.port and grpc.port are both 9000"),
    ({"transport": {"masterPort": 29500}}, "transport.masterPort is the torch_distributed rendezvous port"),
    ({"speculation": {"promptLookupMin": 5, "promptLookupMax": 2}},
     "speculation.promptLookupMin (5) must be at most speculation.promptLookupMax (2)"),
    # each rendered and was refused by the server, or deployed broken (2026-11-28 chart audit)
    ({"http": {"port": 8080}}, "http.port 8080 is Ray's own port (Ray's metrics)"),
    ({"grpc": {"port": 8265}}, "grpc.port 8265 is Ray's own port (the dashboard)"),
    ({"speculation": {"method": "freedave", "disableByBatchSize": 4}},
     "speculation.disableByBatchSize does not apply to freedave"),
    ({"transport": {"kind": "ray", "drafterAddress": "d:1"}}, "transport.drafterAddress is the Drafter of transport.kind grpc"),
    ({"speculation": {"method": "draft_model", "draftModel": "d", "layerParallel": 2},
      "draft": {"groupSize": 2, "replicas": 2, "maxReplicas": 2}, "transport": {"kind": "torch_distributed"}},
     "draft.groupSize 2 needs transport.kind ray"),
    ({"speculation": {"method": "eagle", "draftModel": "d"}, "draft": {"replicas": 0, "minReplicas": 0}},
     "draft.replicas (0) leaves the draft pool no pod"),
    ({"speculation": {"method": "eagle", "draftModel": "d"}, "transport": {"kind": "inline"}, "draft": {"gpus": 1}},
     "transport inline runs the draft inside the Serve replica, which reserves no GPU"),
    ({"model": {"target": "smollm2-135m-dllm"}, "target": {"tensorParallel": 2, "replicas": 2, "maxReplicas": 2}},
     "smollm2-135m-dllm is a diffusion LM, served on one worker"),
    ({"extraEnv": [{"name": "SPECRAY_API_KEY", "value": "k"}]}, "extraEnv SPECRAY_API_KEY would be ignored"),
    ({"modelStorage": {"type": "pvc"}}, "modelStorage.type pvc needs modelStorage.pvc.claimName"),
    ({"modelStorage": {"type": "initContainer"}}, "modelStorage.type initContainer needs modelStorage.initContainer.command"),
    # each rendered and was refused by the server at deploy time, or deployed broken (2026-12 chart review)
    ({"target": {"kernels": "fast"}},
     "target.kernels fast is a CPU kernels' mode on fp32 weights; the target's device cuda with dtype bfloat16"),
    ({"target": {"kernels": "fast16"}},
     "target.kernels fast16 is a CPU kernels' mode on fp32 weights; the target's device cuda with dtype bfloat16"),
    ({"target": {"kernels": "fast", "gpus": 0}}, "the target's device cpu with dtype bfloat16 would not use it"),
    ({"target": {"kernels": "fast", "gpus": 0, "dtype": "float32", "device": "cuda:0"}},
     "the target's device cuda:0 with dtype float32 would not use it"),
    ({"model": {"target": "smollm2-135m-dllm"}, "target": {"kernels": "fast", "gpus": 0, "dtype": "float32"}},
     "target.kernels fast applies to autoregressive GGUF models; smollm2-135m-dllm is a diffusion LM"),
    ({"target": {"gpus": 0, "device": "cuda"}}, "target.device cuda needs a GPU in the target pods"),
    ({"speculation": {"method": "eagle", "draftModel": "d"}, "draft": {"device": "cuda", "gpus": 0}},
     "draft.device cuda needs a GPU in the draft pods, but draft.gpus resolves to 0"),
    ({"speculation": {"method": "eagle", "draftModel": "d"}, "target": {"gpus": 0}, "draft": {"device": "cuda"}},
     "draft.device cuda needs a GPU in the draft pods, but draft.gpus resolves to 0"),  # null: none beside a CPU target
    ({"draft": {"device": "cuda"}},  # the default method drafts in the replica
     "draft.device cuda: transport inline runs the draft inside the Serve replica, which reserves no GPU"),
    ({"speculation": {"method": "draft_model", "draftModel": "d", "layerParallel": 2}, "autoscaling": {"enabled": True},
      "draft": {"groupSize": 2, "replicas": 2, "maxReplicas": 2}},
     "draft.minReplicas (1) must be at least draft.groupSize (2) when autoscaling"),
    ({"serve": {"configOverrides": {"http": {"port": 8001}}}}, "serve.configOverrides.http.port is the chart's own setting: set http.port"),
    ({"serve": {"configOverrides": {"grpc": {"port": 9001}}}}, "serve.configOverrides.grpc.port is the chart's own setting: set grpc.port"),
    ({"serve": {"configOverrides": {"grpc": {"enabled": False}}}},
     "serve.configOverrides.grpc.enabled is the chart's own setting: set grpc.enabled"),
    ({"serve": {"configOverrides": {"http": {"keep_alive_timeout_s": 30}}}},
     "serve.configOverrides.http.keep_alive_timeout_s is the chart's own setting: set http.keepAliveTimeoutS"),
    ({"serve": {"configOverrides": {"http": {"server": "replica"}}}},
     "serve.configOverrides.http.server is the chart's own setting: the chart serves through Ray Serve's proxies"),
])
def test_templates_reject(values, message):
    with pytest.raises(helm_python.HelmRenderError) as e:
        render(values)
    assert message in str(e.value)


@pytest.mark.parametrize("values", [
    {"target": {"kernels": "fast", "gpus": 0, "dtype": "fp32"}},
    {"target": {"kernels": "fast", "gpus": 0, "dtype": "float32", "device": "cpu"}},
    {"target": {"kernels": "fast16", "gpus": 0, "dtype": "float32", "device": "cpu"}},
    {"speculation": {"method": "eagle", "draftModel": "d"}, "draft": {"device": "cuda:0"}},  # null: one GPU
    {"speculation": {"method": "ngram"}, "transport": {"kind": "ray"}, "draft": {"device": "cuda", "gpus": 1}},
    {"serve": {"configOverrides": {"http": {"max_request_bytes": 4096}, "grpc": {"max_message_bytes": 4096}}}},
])
def test_what_the_checks_let_through_the_server_takes(values):
    """The render-time checks mirror the server's rules (cluster/config/pools.py, serve.py), no stricter."""
    from helm_checks import app_config, pool_resource_problems

    from specray.cluster.config.serve import ServeConfig

    rayservice = render(values).rayservice
    ServeConfig.from_dict(app_config(rayservice))
    assert pool_resource_problems(rayservice) == []
