"""`specray bench serve` / `bench cluster` latency percentiles: interpolated as numpy's (and vLLM's
benchmark) are; the p50 of two requests was the slower one."""

import numpy as np
import pytest

from specray.cluster.bench.serve import percentiles


@pytest.mark.parametrize("values", [[0.1401, 0.175], [3.0], list(range(1, 11)), [5, 1, 4, 2, 3, 9, 7]])
def test_percentiles_are_numpy_s(values):
    got = percentiles([float(v) for v in values])
    assert [got[k] for k in ("p50", "p90", "p99")] == pytest.approx(
        [np.percentile(values, q) for q in (50, 90, 99)], abs=1e-4)


def test_no_values_no_percentiles():
    assert percentiles([]) == {"p50": None, "p90": None, "p99": None}
