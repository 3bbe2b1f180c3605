"""Checks on rendered manifests: schemas (KubeRay CRD, Kubernetes core, ServiceMonitor) and the
agreement between the worker groups' Ray resources and the Serve config's pools."""

from __future__ import annotations

import copy
import functools
import importlib.resources
import json
import math
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from referencing import Registry, Resource

from specray.cluster.config.serve import ServeConfig

HERE = Path(__file__).parent
K8S_VERSION = "1.30"  # the chart's floor is 1.25; 1.30 is a common supported cluster version
CORE_KINDS = ("Service", "Secret", "PersistentVolumeClaim", "Pod")


# ---- schemas -----------------------------------------------------------------------------------

def _closed(schema: Any) -> Any:
    """The API server prunes unknown fields silently (a typo is lost, not rejected); close every
    object that lists its properties, as `kubectl apply --validate=strict` would, so typos fail."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@functools.lru_cache(maxsize=None)
def crd_validator(crd_file: str, version: str = "v1") -> jsonschema.Validator:
    crd = yaml.load((HERE / "crds" / crd_file).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (ver,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return jsonschema.Draft7Validator(_closed(ver["schema"]["openAPIV3Schema"]))


@functools.lru_cache(maxsize=1)
def _k8s_registry() -> Registry:
    root = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
    (folder,) = [d for d in root.iterdir() if d.name == f"v{K8S_VERSION}.0-local-strict"]
    defs = json.loads((folder / "_definitions.json").read_text())
    return Resource.from_contents(defs) @ Registry()


@functools.lru_cache(maxsize=1)
def servicemonitor_validator() -> jsonschema.Validator:
    schema = json.loads((HERE / "schemas" / "servicemonitor-v1.json").read_text())
    return jsonschema.Draft202012Validator(schema, registry=_k8s_registry())


def schema_errors(obj: dict[str, Any]) -> list[str]:
    """Every schema violation of one rendered object, as "Kind/name: path: message"."""
    kind, name = obj.get("kind"), obj.get("metadata", {}).get("name")
    if kind == "RayService":
        validator = crd_validator("ray.io_rayservices.yaml")
    elif kind == "ServiceMonitor":
        validator = servicemonitor_validator()
    elif kind in CORE_KINDS:
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            return []
        except kubernetes_validate.ValidationError as e:
            return [f"{kind}/{name}: {'.'.join(map(str, e.path))}: {e.message}"]
    else:
        return [f"{kind}/{name}: no schema for this kind"]
    return [f"{kind}/{name}: {'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(obj)]


# ---- Ray resources agreement ---------------------------------------------------------------------

def serve_deploy_config(rayservice: dict[str, Any]) -> dict[str, Any]:
    return yaml.safe_load(rayservice["spec"]["serveConfigV2"])


def app_config(rayservice: dict[str, Any]) -> dict[str, Any]:
    """The ServeConfig dict handed to build_app (args.config of the one application)."""
    (app,) = serve_deploy_config(rayservice)["applications"]
    return app["args"]["config"]


def ray_resources_param(value: str) -> dict[str, float]:
    """Undo KubeRay's quoting: it pastes the value after `ray start --resources=` in a bash command,
    so the shell's quote removal (shlex in POSIX mode) yields the JSON Ray parses."""
    words = shlex.split(value)
    if len(words) != 1:
        raise ValueError(f"rayStartParams.resources {value!r} is not one shell word")
    return json.loads(words[0])


def _cpu(quantity: Any) -> float:
    q = str(quantity)
    return float(q[:-1]) / 1000 if q.endswith("m") else float(q)


def _node(group: dict[str, Any]) -> dict[str, float]:
    """What the group's Ray nodes advertise: custom resources plus CPU/GPU as KubeRay derives them."""
    params = group.get("rayStartParams") or {}
    container = group["template"]["spec"]["containers"][0]
    res = container.get("resources") or {}
    limits, requests = res.get("limits") or {}, res.get("requests") or {}
    node = ray_resources_param(params["resources"]) if "resources" in params else {}
    if "num-cpus" in params:
        node["CPU"] = float(params["num-cpus"])
    else:  # KubeRay rounds the limit (else the request) up; with neither, Ray counts the host's CPUs
        cpu = limits.get("cpu", requests.get("cpu"))
        node["CPU"] = math.ceil(_cpu(cpu)) if cpu is not None else math.inf
    node["GPU"] = float(params.get("num-gpus", limits.get("nvidia.com/gpu", 0)))
    return node


def pool_resource_problems(rayservice: dict[str, Any]) -> list[str]:
    """Why the pools of the rendered Serve config could not be placed on the rendered groups ([] if they can).

    Each active pool must have a worker group of its own name advertising exactly the pool's custom
    resources (one worker per pod), no other node advertising them (draft and target never share a
    node), enough pods for its workers, and the CPUs/GPUs each worker reserves.
    """
    cluster = rayservice["spec"]["rayClusterConfig"]
    groups = {g["groupName"]: g for g in cluster.get("workerGroupSpecs") or []}
    nodes = {name: _node(g) for name, g in groups.items()}
    nodes["<head>"] = _node(cluster["headGroupSpec"])
    cfg = ServeConfig.from_dict(app_config(rayservice))
    in_cluster = {"target"}
    if cfg.speculative_config and cfg.draft_transport not in ("grpc", "inline"):
        in_cluster.add("draft")
    problems = []
    if cfg.pools.colocate is not False:  # auto could resolve to the replica on a head-only cluster
        problems.append(f"pools.colocate is {cfg.pools.colocate!r}: the chart's pools run in their own pods")
    if "draft" in groups and not cfg.speculative_config:
        problems.append("a draft worker group is rendered but speculative_config is null")
    for pool_name in sorted(in_cluster):
        pool = getattr(cfg.pools, pool_name)
        group = groups.get(pool_name)
        if group is None:
            problems.append(f"pool {pool_name}: no worker group named {pool_name!r}")
            continue
        custom = {k: v for k, v in nodes[pool_name].items() if k not in ("CPU", "GPU")}
        if custom != pool.resources:
            problems.append(f"pool {pool_name}: group advertises {custom}, config requests {pool.resources}")
        for other, node in nodes.items():
            shared = sorted(set(pool.resources) & set(node)) if other != pool_name else []
            if shared:
                problems.append(f"pool {pool_name}: {other} also advertises {shared}")
        if group["replicas"] < pool.num_workers:
            problems.append(f"pool {pool_name}: {pool.num_workers} workers need {pool.num_workers} pods, "
                            f"group has replicas={group['replicas']}")
        for key, want in (("CPU", pool.num_cpus), ("GPU", pool.num_gpus)):
            if nodes[pool_name][key] < want:
                problems.append(f"pool {pool_name}: a worker reserves {want} {key}, a pod has {nodes[pool_name][key]}")
        if pool.device.startswith("cuda") and pool.num_gpus <= 0:
            problems.append(f"pool {pool_name}: device {pool.device} with num_gpus 0")
    return problems


def kuberay_serve_service(rayservice: dict[str, Any], cluster: str = "demo-specray-abcde") -> dict[str, Any]:
    """The Service KubeRay (v1.6+, as v1.7.0's BuildServeService) makes of spec.serveService for the
    active RayCluster `cluster`: its own selector (the active cluster's pods that serve), the head
    container's ports named "serve"/"serve-*", each in the serveService's form where it names one too
    (any other port is dropped), its own labels over the chart's."""
    svc = copy.deepcopy(rayservice["spec"]["serveService"])
    head = rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    auto = [p for p in head.get("ports") or [] if p["name"] == "serve" or p["name"].startswith("serve-")]
    given = {p["name"]: p for p in svc["spec"].get("ports") or []}
    if auto:
        svc["spec"]["ports"] = [given.get(p["name"], {"name": p["name"], "port": p["containerPort"]}) for p in auto]
    else:
        svc["spec"]["ports"] = [p for p in given.values() if p["name"] == "serve" or p["name"].startswith("serve-")]
    svc["spec"]["selector"] = {"ray.io/cluster": cluster, "ray.io/serve": "true"}
    name = rayservice["metadata"]["name"]
    svc["metadata"]["labels"] = {**svc["metadata"].get("labels", {}), "ray.io/originated-from-cr-name": name,
                                 "ray.io/originated-from-crd": "RayService", "ray.io/serve": f"{name}-serve"}
    svc["metadata"].setdefault("name", f"{name}-serve-svc")
    svc["spec"].setdefault("type", "ClusterIP")
    return {"apiVersion": "v1", "kind": "Service", **svc}


def with_app_config(rayservice: dict[str, Any], edit) -> dict[str, Any]:
    """A copy of the RayService whose Serve app config went through `edit(config_dict)`."""
    out = copy.deepcopy(rayservice)
    deploy = serve_deploy_config(out)
    edit(deploy["applications"][0]["args"]["config"])
    out["spec"]["serveConfigV2"] = yaml.safe_dump(deploy)
    return out
