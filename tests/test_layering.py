"""DESIGN §1 layering: kernels imports neither ray nor grpc; actors only kernels; protos neither
torch nor ray. Inside cluster/, the jobs layer as config < router, pools < serve < bench, distill:
the router sees the pools only through their protocols, and no Ray or RPC library."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
C = "specray.cluster."
TRANSPORTS = {C + f"pools.{m}" for m in ("ray_pools", "ray_diffusion", "builder", "build", "grpc_transport", "dist_transport",
                                         "draft_endpoint", "wire", "in_process",
                                         "local_channel", "worker_calls", "compute_thread")}
RULES = {
    "kernels": {"ray", "grpc", "specray.actors", "specray.cluster", "specray.protos"},
    "actors": {"ray", "grpc", "specray.cluster", "specray.protos"},
    "protos": {"torch", "ray", "specray.kernels", "specray.actors", "specray.cluster", "transformers"},
    "cluster/config": {"ray", "grpc", "fastapi", "specray.protos", *(C + j for j in
                       ("router", "pools", "serve", "bench", "distill"))},
    "cluster/router": {"ray", "grpc", "fastapi", "specray.protos", *TRANSPORTS, *(C + j for j in
                       ("config", "serve", "bench", "distill"))},
    "cluster/pools": {"fastapi", *(C + j for j in ("router", "serve", "bench", "distill"))},
    "cluster/serve": {C + "bench", C + "distill"},
}


def imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)  # and each name, which may be a module: `from pkg import module`
            names.update(f"{node.module}.{a.name}" for a in node.names)
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
    (tmp_path / "cluster" / "router").mkdir(parents=True)
    (tmp_path / "cluster" / "router" / "bad.py").write_text("from specray.cluster.pools import ray_pools\n")
    assert violations("cluster/router", tmp_path) == [
        "cluster/router/bad.py imports specray.cluster.pools.ray_pools"]
