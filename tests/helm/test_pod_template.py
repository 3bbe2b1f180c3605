"""What every Ray pod's template carries whatever the configuration: the selector labels, the serve
ports, the security contexts."""

from helm_checks import app_config


def _containers(r):
    cluster = r.rayservice["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    return [c for p in pods for c in p["spec"]["containers"]]


def test_pod_labels_never_replace_the_selector_labels():
    """A duplicate key rendered twice (strict parsers refuse it; others relabel the head and the
    Services select nothing)."""
    from helm_render import render

    r = render({"head": {"podLabels": {"app.kubernetes.io/component": "x", "team": "ml"}}})
    labels = r.rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "head" and labels["team"] == "ml"


def test_grpc_off_frees_its_port_for_http():
    from helm_render import render

    assert app_config(render({"grpc": {"enabled": False}, "http": {"port": 9000}}).rayservice)["http"]["port"] == 9000


def test_security_contexts_reach_every_ray_pod():
    """A Pod Security "restricted" namespace needs them; the chart had no way to set them."""
    from helm_render import render

    pod = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    container = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    r = render({"podSecurityContext": pod, "securityContext": container,
                "speculation": {"method": "eagle", "draftModel": "d"}})
    cluster = r.rayservice["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    assert len(pods) == 3 and all(p["spec"]["securityContext"] == pod for p in pods)
    assert all(c["securityContext"] == container for c in _containers(r))
    test = next(p for p in r.of_kind("Pod") if p["metadata"]["labels"]["app.kubernetes.io/component"] == "test")
    assert test["spec"]["securityContext"] == pod and test["spec"]["containers"][0]["securityContext"] == container
