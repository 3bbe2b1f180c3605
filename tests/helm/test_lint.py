"""`helm lint --strict` (Helm's own linter, through helm-python-sdk) finds no warnings or errors."""

import helm_python
import pytest
from helm_render import CHART, values_file


@pytest.mark.parametrize("files", [(), ("values-cpu.yaml",)])
@pytest.mark.parametrize("kube_version", ["v1.25.0", "v1.33.0"])
def test_lint_strict(files, kube_version):
    values = values_file(files[0]) if files else None
    report = helm_python.lint(CHART, values, strict=True, kube_version=kube_version)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
