"""DESIGN §1 layering: kernels imports neither ray nor grpc; actors only kernels; protos neither
torch nor ray."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RULES = {
    "kernels": {"ray", "grpc", "specray.actors", "specray.cluster", "specray.protos"},
    "actors": {"ray", "grpc", "specray.cluster", "specray.protos"},
    "protos": {"torch", "ray", "specray.kernels", "specray.actors", "specray.cluster", "transformers"},
}


def imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def violations(folder: str, root: Path = ROOT) -> list[str]:
    bad = []
    for path in sorted((root / folder).rglob("*.py")):
        for name in imports(path):
            if any(name == f or name.startswith(f + ".") for f in RULES[folder]):
                bad.append(f"{path.relative_to(root)} imports {name}")
    return bad


@pytest.mark.parametrize("folder", sorted(RULES))
def test_layering(folder):
    assert violations(folder) == []


def test_checker_catches_a_violation(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "bad.py").write_text("import ray.util\n")
    assert violations("kernels", tmp_path) == ["kernels/bad.py imports ray.util"]
