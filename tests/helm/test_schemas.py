"""Every rendered object validates: RayService against KubeRay's CRD, core kinds against the
Kubernetes schemas, serveConfigV2 against Ray Serve's and specray's own config models."""

import pytest
import yaml
from helm_checks import app_config, kuberay_serve_service, schema_errors, serve_deploy_config
from helm_scenarios import SCENARIOS

from specray.cluster.config.serve import ServeConfig


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_objects_match_their_schemas(rendered, scenario):
    # with the Service KubeRay makes of spec.serveService (the CRD checks only its fields' types)
    objects = rendered[scenario].objects + [kuberay_serve_service(rendered[scenario].rayservice)]
    errors = [e for obj in objects for e in schema_errors(obj)]
    assert errors == []


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_serve_config_is_valid(rendered, scenario):
    serve_schema = pytest.importorskip("ray.serve.schema")
    rayservice = rendered[scenario].rayservice
    serve_schema.ServeDeploySchema.model_validate(serve_deploy_config(rayservice))
    ServeConfig.from_dict(app_config(rayservice))  # raises ValueError listing every problem


def test_crd_check_catches_a_typo(rendered):
    rayservice = yaml.safe_load(yaml.safe_dump(rendered["default"].rayservice))
    rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["replica"] = 2  # not "replicas"
    rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = 1  # not a string
    errors = schema_errors(rayservice)
    assert any("'replica' was unexpected" in e for e in errors), errors
    assert any("rayStartParams.num-cpus: 1 is not of type 'string'" in e for e in errors), errors


def test_core_check_catches_a_bad_service(rendered):
    service = kuberay_serve_service(rendered["default"].rayservice)
    service["spec"]["ports"][0]["port"] = "eight thousand"
    assert schema_errors(service)


@pytest.mark.parametrize("scenario", ["default", "no-draft", "api-key"])
def test_the_real_builder_accepts_the_rendered_app(rendered, scenario):
    """The contract with the Serve app: import_path resolves and build_app takes the rendered args."""
    (app,) = serve_deploy_config(rendered[scenario].rayservice)["applications"]
    module, name = app["import_path"].split(":")
    serve_app = pytest.importorskip(module)
    application = getattr(serve_app, name)(app["args"])
    assert type(application).__name__ == "Application"


def test_grpc_servicer_functions_resolve(rendered):
    for path in serve_deploy_config(rendered["default"].rayservice)["grpc_options"]["grpc_servicer_functions"]:
        module, _, name = path.rpartition(".")
        assert callable(getattr(pytest.importorskip(module), name))
