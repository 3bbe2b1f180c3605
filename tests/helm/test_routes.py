"""The chart's own routes (the helm test pod, the ServiceMonitor, NOTES) follow serve.routePrefix."""

from helm_render import render


def test_a_route_prefix_moves_the_charts_own_routes_with_the_app():
    """The helm test pod, the ServiceMonitor and NOTES asked for /health and /metrics at the root
    while the app answered under the prefix (404: `helm test` failed)."""
    r = render({"serve": {"routePrefix": "/api/"}, "monitoring": {"serviceMonitor": {"enabled": True}}})
    assert r.one("Pod")["spec"]["containers"][0]["command"][-1] == "http://demo-specray-http:8000/api/health"
    assert r.one("ServiceMonitor")["spec"]["endpoints"][0]["path"] == "/api/metrics"
    assert "localhost:8000/api/v1/models" in r.notes and 'base_url="http://localhost:8000/api/v1"' in r.notes
