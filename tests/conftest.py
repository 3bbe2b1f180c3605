import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
# pytest-xdist workers (pyproject's addopts) share the cores: each gets its share of intra-op threads,
# since oversubscribed OpenMP threads spin against each other.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, torch.get_num_threads()) // WORKERS))

# Ray starts its worker processes at nice 15: beside the other xdist worker's computing (nice 0)
# they got a few per cent of a core (a two-rank TP test: 7 s alone, 89 s in the suite). The tests'
# clusters and the `specray serve` they start inherit this.
os.environ.setdefault("RAY_worker_niceness", "0")

from helpers import save_tiny_llama  # noqa: E402


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: one worker per core, at most four (each holds its own copy of the test models)."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks
def pytest_collection_modifyitems(config, items) -> None:
    """Under `--dist loadgroup` a module's tests stay on one worker (its module fixtures are built
    once), and the modules marked xdist_group("ray") share one worker (one Ray cluster at a time)."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for modules of many tiny steps (or ranks as threads/processes): a second
    thread only spin-waits against the others on a shared 2-core box."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def peaky_models(tmp_path_factory):
    """A peakier target than the shared one and its perturbed draft, so that a biased verification
    rule moves the output distribution a lot (the engine-wide chi-square tests)."""
    target = save_tiny_llama(tmp_path_factory.mktemp("peaky_target"), seed=0, head_scale=3.0)
    draft = save_tiny_llama(tmp_path_factory.mktemp("peaky_draft"), seed=1, perturb_from=target, noise=0.35)
    return target, draft


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_target"), seed=0)


@pytest.fixture(scope="session")
def tiny_longspec(tmp_path_factory, tiny_target) -> Path:
    """A LongSpec draft of the tiny target, window 6 (shorter than most test prompts)."""
    from longspec_helpers import save_tiny_longspec

    return save_tiny_longspec(tmp_path_factory.mktemp("tiny_longspec") / "draft", tiny_target, window=6)


@pytest.fixture(scope="session")
def tiny_gguf_target(tmp_path_factory) -> Path:
    """The tiny target with weights a GGUF Q4_1/Q8_0 file holds exactly (packed-kernel path)."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_gguf_target"), seed=0, gguf=True)


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory, tiny_target) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_draft"), seed=1, perturb_from=tiny_target,
                           noise=0.35)


@pytest.fixture(scope="session")
def ray_cluster():
    """One multi-node Ray cluster on this machine for the whole session (start-up is the slow part):
    a head, a node advertising `draft` and a node advertising `target`. Logical CPUs, so several
    pools can coexist. The head advertises `driver_node`: workers placed there share the test
    process's node (same-node channels)."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                                "resources": {"driver_node": 4}})
    nodes = {"draft": cluster.add_node(num_cpus=3, resources={"draft": 3}),
             "target": cluster.add_node(num_cpus=4, resources={"target": 4})}
    ray.init(address=cluster.address, log_to_driver=False)
    yield nodes
    ray.shutdown()
    cluster.shutdown()
