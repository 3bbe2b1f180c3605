import sys
from pathlib import Path

import pytest

# helm_render / helm_checks sit beside the tests (unique names: tests/ is on sys.path too).
sys.path.insert(0, str(Path(__file__).parent))

from helm_render import render  # noqa: E402
from helm_scenarios import SCENARIOS  # noqa: E402


@pytest.fixture(scope="session")
def rendered():
    """Render each scenario once per session: {name: Rendered}."""
    return {name: render(over, files=files) for name, (files, over) in SCENARIOS.items()}
