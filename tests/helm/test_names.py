"""Object names stay within Kubernetes' limits for the longest release names Helm accepts."""

import re

import pytest
from helm_render import render

DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LONG = "a-very-long-release-name-for-the-speculative-servers"  # 52 characters; Helm allows 53


@pytest.mark.parametrize("name, values", [
    (LONG, {}),
    ("x", {"fullnameOverride": "f" * 80}),
    (LONG, {"nameOverride": "n" * 70}),
])
def test_names_fit(name, values):
    values = {**values, "apiKey": {"enabled": True, "value": "k"},
              "monitoring": {"serviceMonitor": {"enabled": True}},
              "modelStorage": {"type": "pvc", "pvc": {"create": True}}}
    r = render(values, name=name)
    # RayService, its serveService (KubeRay creates it), Secret, PVC, ServiceMonitor, test Pod
    names = [o["metadata"]["name"] for o in r.objects] + [r.rayservice["spec"]["serveService"]["metadata"]["name"]]
    assert len(names) == len(set(names)) == 6
    for n in names:
        assert len(n) <= 63 and DNS_1035.match(n), n
    assert len(r.rayservice["metadata"]["name"]) <= 47  # KubeRay appends "-<5 chars>" and "-head-svc"
    for o in r.objects:
        for v in o["metadata"].get("labels", {}).values():
            assert len(v) <= 63, v


def test_default_names():
    r = render(name="prod")
    assert sorted(o["metadata"]["name"] for o in r.objects) == ["prod-specray", "prod-specray-test-health"]
    assert r.rayservice["spec"]["serveService"]["metadata"]["name"] == "prod-specray-http"
