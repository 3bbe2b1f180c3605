"""Shared by the distill tests: one tiny distillation run for the session."""

import pytest

from specray.cluster.cli import main

from distill_helpers import ARGS


@pytest.fixture(scope="session")
def distilled(tiny_target, tmp_path_factory):
    out = tmp_path_factory.mktemp("distill")
    assert main(["distill", "--model", str(tiny_target), "--out", str(out), *ARGS]) == 0
    return out
