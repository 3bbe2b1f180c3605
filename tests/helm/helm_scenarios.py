"""The renderings most chart tests look at."""

# name -> (values files of the chart, overrides)
SCENARIOS = {
    "default": ((), {}),
    "cpu": (("values-cpu.yaml",), {}),
    "tp2": ((), {"target": {"tensorParallel": 2, "replicas": 2, "minReplicas": 2, "maxReplicas": 2}}),
    "no-draft": ((), {"speculation": {"method": "none"}}),
    "eagle": ((), {"speculation": {"method": "eagle", "draftModel": "smollm2-135m-eagle"}}),  # a GPU draft group
    "api-key": ((), {"apiKey": {"enabled": True, "value": "s3cret"}}),
    "draft-model": (("values-cpu.yaml",), {"speculation": {"method": "draft_model", "draftModel": "/models/draft"},
                                          "modelStorage": {"type": "pvc", "pvc": {"create": True}},
                                          "draft": {"rayResources": {"draft": 1, "draft_mem": 2}}}),
    "everything": ((), {"apiKey": {"enabled": True, "existingSecret": "my-key"},
                        "monitoring": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
                        "modelStorage": {"type": "initContainer",
                                         "initContainer": {"command": ["sh", "-c", "cp -r /src/. $MODEL_DIR"]}},
                        "transport": {"kind": "torch_distributed", "masterPort": 29500},
                        "autoscaling": {"enabled": True},
                        "draft": {"maxReplicas": 3, "nodeSelector": {"pool": "draft"}},
                        "target": {"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                            {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                                              "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "target"}}}}]}}},
                        "head": {"readinessProbe": {"exec": {"command": ["true"]}}},
                        "serve": {"configOverrides": {"router": {"max_num_seqs": 4}, "served_model_name": "m"}}}),
    "grpc-drafter": ((), {"transport": {"kind": "grpc", "drafterAddress": "drafter:50051"}, "draft": {"enabled": False},
                          "grpc": {"enabled": False}, "modelStorage": {"type": "hostPath"}}),
}
