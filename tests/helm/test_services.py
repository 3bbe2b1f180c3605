"""What the chart renders for traffic: the Serve ports and the KubeRay-managed Service, keep-alive,
the head's probes and the helm test's health check."""

import pytest

from helm_checks import app_config, kuberay_serve_service, serve_deploy_config

from specray.cluster.config.serve import ServeConfig


def test_serve_ports_and_services(rendered):
    r = rendered["default"]
    deploy = serve_deploy_config(r.rayservice)
    assert deploy["http_options"]["port"] == 8000
    from specray.cluster.serve.run import GRPC_SERVICERS

    # the same services `specray serve` registers on Serve's proxy (health was missing: UNIMPLEMENTED)
    assert deploy["grpc_options"] == {"port": 9000, "grpc_servicer_functions": GRPC_SERVICERS}
    (app,) = deploy["applications"]
    assert app["import_path"] == "specray.cluster.serve.app:build_app"
    head = r.rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]
    named = {p["name"]: p["containerPort"] for p in head["spec"]["containers"][0]["ports"]}
    assert named["serve"] == 8000 and named["serve-grpc"] == 9000
    service = kuberay_serve_service(r.rayservice)
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert {n: (p["port"], p["targetPort"]) for n, p in ports.items()} == {"serve": (8000, "serve"),
                                                                           "serve-grpc": (9000, "serve-grpc")}


def test_keep_alive_reaches_serves_proxy(rendered):
    """http_options had host and port only: Serve's proxy kept its own 90 s keep-alive while the config
    (and `specray serve`, cluster/serve/run.py) said 5 s."""
    from helm_render import render

    serve_schema = pytest.importorskip("ray.serve.schema")
    deploy = serve_deploy_config(rendered["default"].rayservice)
    assert deploy["http_options"]["keep_alive_timeout_s"] == 5 == app_config(rendered["default"].rayservice)["http"]["keep_alive_timeout_s"]
    rayservice = render({"http": {"keepAliveTimeoutS": 75}}).rayservice
    deploy = serve_schema.ServeDeploySchema.model_validate(serve_deploy_config(rayservice))
    assert deploy.http_options.keep_alive_timeout_s == 75
    assert ServeConfig.from_dict(app_config(rayservice)).http.keep_alive_timeout_s == 75


def test_the_service_follows_only_the_active_cluster():
    """The chart's Services selected every head labelled ray.io/serve=true, and KubeRay labels the pending
    cluster's head too during an upgrade: traffic split to an app not yet ready. The Service is now the
    RayService's serveService, whose selector KubeRay sets to the active cluster; its names and ports
    stay (the helm test, NOTES and the ServiceMonitor use them)."""
    from helm_render import render

    r = render({"services": {"http": {"port": 80, "type": "LoadBalancer", "annotations": {"a": "b"}},
                             "grpc": {"port": 443}},
                "monitoring": {"serviceMonitor": {"enabled": True}}})
    assert r.of_kind("Service") == []  # none with a selector of the chart's own
    declared = r.rayservice["spec"]["serveService"]
    assert "selector" not in declared["spec"]  # KubeRay's to set
    service = kuberay_serve_service(r.rayservice, cluster="demo-specray-new")
    assert service["metadata"]["name"] == "demo-specray-http"
    assert service["spec"]["selector"] == {"ray.io/cluster": "demo-specray-new", "ray.io/serve": "true"}
    assert service["spec"]["type"] == "LoadBalancer" and service["metadata"]["annotations"] == {"a": "b"}
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
    assert ports == {"serve": (80, "serve"), "serve-grpc": (443, "serve-grpc")}  # the values' ports survive
    assert r.one("Pod")["spec"]["containers"][0]["command"][-1] == "http://demo-specray-http:80/health"
    monitor = r.one("ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == "serve"
    assert "port-forward svc/demo-specray-http 8000:80" in r.notes
    assert "port-forward svc/demo-specray-http 9000:443" in r.notes


def test_head_keeps_kuberay_probes_and_helm_test_checks_health(rendered):
    r = rendered["default"]
    head = r.rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert "readinessProbe" not in head and "livenessProbe" not in head
    # a chart upgrade alone must not change the pod templates (KubeRay would roll a new cluster)
    template = r.rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]
    assert "helm.sh/chart" not in template["metadata"]["labels"]
    pod = r.one("Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["containers"][0]["command"][-1] == "http://demo-specray-http:8000/health"
    assert "port-forward svc/demo-specray-http 8000:8000" in r.notes
    assert "curl -s localhost:8000/health" in r.notes
