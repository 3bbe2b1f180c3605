"""Render helm/specray with Helm's own engine (helm-python-sdk: Helm's Go SDK through ctypes).

No helm binary, no cluster, no network: `Chart.render` is `helm template`. It also validates the
values against values.schema.json, as `helm install` does.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "specray"
NAMESPACE = "specray"


@functools.lru_cache(maxsize=1)
def chart() -> helm_python.Chart:
    return helm_python.Chart.load(CHART)  # kept open for the session; charts are immutable


def values_file(name: str) -> dict[str, Any]:
    return helm_python.values_from_yaml((CHART / name).read_text())


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep merge like `helm -f a.yaml -f b.yaml`: later maps win key by key, lists are replaced."""
    out = copy.deepcopy(base)
    for k, v in override.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


@dataclass
class Rendered:
    objects: list[dict[str, Any]]  # every manifest, by template path
    notes: str

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str) -> dict[str, Any]:
        found = self.of_kind(kind)
        assert len(found) == 1, f"expected one {kind}, found {len(found)}"
        return found[0]

    @property
    def rayservice(self) -> dict[str, Any]:
        return self.one("RayService")


def render(values: dict[str, Any] | None = None, *, files: tuple[str, ...] = (),
           name: str = "demo", namespace: str = NAMESPACE) -> Rendered:
    """Render with values files of the chart (e.g. "values-cpu.yaml") merged, then `values` on top."""
    merged: dict[str, Any] = {}
    for f in files:
        merged = merge(merged, values_file(f))
    merged = merge(merged, values or {})
    out = chart().render(merged, name=name, namespace=namespace, is_install=True)
    objects, notes = [], ""
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        objects += [d for d in yaml.safe_load_all(text) if d]
    return Rendered(objects, notes)
