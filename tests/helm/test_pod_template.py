"""What every Ray pod's template carries whatever the configuration: the selector labels, the serve
ports, the security contexts, the API key's checksum."""

from helm_checks import app_config


def _containers(r):
    cluster = r.rayservice["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    return [c for p in pods for c in p["spec"]["containers"]]


def test_pod_labels_never_replace_the_selector_labels():
    """A duplicate key rendered twice (strict parsers refuse it; others relabel the head, and selectors
    by component find nothing)."""
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


def _templates(r):
    cluster = r.rayservice["spec"]["rayClusterConfig"]
    return [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]


def test_the_weights_init_container_gets_the_container_security_context():
    """It ran without one: a Pod Security "restricted" namespace refused every Ray pod."""
    from helm_render import render

    container = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    r = render({"securityContext": container, "speculation": {"method": "eagle", "draftModel": "d"},
                "modelStorage": {"type": "initContainer", "initContainer": {"command": ["sh", "-c", "true"]}}})
    inits = [c for p in _templates(r) for c in p["spec"]["initContainers"]]
    assert len(inits) == 3 and all(c["securityContext"] == container for c in inits)
    plain = render({"modelStorage": {"type": "initContainer", "initContainer": {"command": ["true"]}}})
    assert all("securityContext" not in c for p in _templates(plain) for c in p["spec"]["initContainers"])


def test_a_new_api_key_rolls_the_cluster():
    """The key reaches the containers as a variable at start: a new apiKey.value changed the Secret
    alone, and the running cluster kept the old key. The pod templates carry the Secret's checksum, so
    KubeRay rolls a new cluster; a chart upgrade alone still changes nothing in them."""
    from helm_render import render

    def annotations(values, **kw):
        return [p["metadata"].get("annotations", {}) for p in _templates(render(values, **kw))]

    spec = {"speculation": {"method": "eagle", "draftModel": "d"}, "head": {"podAnnotations": {"team": "ml"}}}
    one = annotations({**spec, "apiKey": {"enabled": True, "value": "k1"}})
    two = annotations({**spec, "apiKey": {"enabled": True, "value": "k2"}})
    assert len(one) == 3 and len({a["checksum/api-key"] for a in one}) == 1
    assert {a["checksum/api-key"] for a in one}.isdisjoint(a["checksum/api-key"] for a in two)
    assert one[0]["team"] == "ml"  # podAnnotations stay
    assert "k1" not in str(one)
    assert annotations({**spec, "apiKey": {"enabled": True, "value": "k1"}}, name="other") == one
    # a Secret the chart does not make: nothing of it to hash (its rotation is the owner's restart)
    assert all("checksum/api-key" not in a for a in annotations({"apiKey": {"enabled": True, "existingSecret": "s"}}))
    assert all("checksum/api-key" not in a for a in annotations({}))
