import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(min(2, torch.get_num_threads()))

from helpers import save_tiny_llama  # noqa: E402


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_target"), seed=0)


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory, tiny_target) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_draft"), seed=1, perturb_from=tiny_target,
                           noise=0.35)
