import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(min(2, torch.get_num_threads()))

from helpers import save_tiny_llama  # noqa: E402


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
    pools can coexist."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    nodes = {"draft": cluster.add_node(num_cpus=3, resources={"draft": 3}),
             "target": cluster.add_node(num_cpus=4, resources={"target": 4})}
    ray.init(address=cluster.address, log_to_driver=False)
    yield nodes
    ray.shutdown()
    cluster.shutdown()
