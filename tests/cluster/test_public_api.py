"""The import paths users and deployments rely on survive the layout: the public API at `specray` and
`specray.cluster`, the Serve application at the old path deployed RayServices name, the CLI entry and
`python -m specray.cluster.distill`."""

import importlib
import subprocess
import sys
from pathlib import Path

import yaml

import specray
import specray.cluster
from specray.cluster.outputs import CompletionOutput, RequestOutput
from specray.cluster.params import SamplingParams

ROOT = Path(__file__).resolve().parents[2]


def test_public_api_at_specray_and_specray_cluster():
    for root in (specray, specray.cluster):
        assert root.SamplingParams is SamplingParams
        assert root.RequestOutput is RequestOutput and root.CompletionOutput is CompletionOutput
        assert root.LLM is importlib.import_module("specray.cluster.llm").LLM


def test_the_old_serve_app_path_and_the_charts_path_build_the_same_app():
    from specray.cluster.serve.app import build_app
    from specray.cluster.serve_app import build_app as old

    assert old is build_app
    values = yaml.safe_load((ROOT / "helm/specray/values.yaml").read_text())
    module, name = values["serve"]["importPath"].split(":")
    assert getattr(importlib.import_module(module), name) is build_app


def test_cli_entry_and_distill_module_run():
    meta = (ROOT / "pyproject.toml").read_text()
    assert 'specray = "specray.cluster.cli:main"' in meta
    out = subprocess.run([sys.executable, "-m", "specray.cluster.distill", "--help"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "--kind" in out.stdout


def test_every_subpackage_is_in_the_wheel():
    """pyproject.toml lists packages by hand (the folders map onto `specray.*`): an editable install
    finds a package left out, a wheel does not (`specray.kernels.diffusion` was, and `from specray
    import LLM` failed on a plain `pip install .`)."""
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {name: Path(folder) for name, folder in setuptools["package-dir"].items()}
    found = set()
    for root in set(folders.values()):
        for init in (ROOT / root).rglob("__init__.py"):
            folder = init.parent.relative_to(ROOT)
            owner = max((n for n, f in folders.items() if folder == f or f in folder.parents),
                        key=lambda n: len(folders[n].parts))  # the innermost mapping holds it
            found.add(".".join([owner, *folder.relative_to(folders[owner]).parts]))
    assert found == set(setuptools["packages"])
