"""What the C kernels' wrappers take: a step of many rows on a small stack, a process whose torch
default dtype is not float32, the caller's tensors left as they were, and arguments the C code
cannot read refused before the call."""

import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import save_tiny_llama
from specray.kernels import cpu_kernels, cpu_ops
from specray.kernels.batch import RaggedBatch, SeqChunk
from specray.kernels.fast_linear import FastWeight
from specray.kernels.loader import Checkpoint, load_model
from specray.kernels.quant_linear import PackedWeight

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C compiler: the torch paths run")

MANY_ROWS = """
import torch
from specray.kernels import cpu_ops
n, heads, kv_heads, dim = 20000, 8, 1, 16  # one-row sequences: a long prompt's unchunked prefill is as many
qkv = torch.randn(n, heads + 2 * kv_heads, dim)
kv = torch.randn(2 * kv_heads, n, dim)
slots, zeros = torch.arange(n), torch.zeros(n, dtype=torch.long)
rows = cpu_ops.AttentionRows(slots.clone(), zeros, torch.ones(n, dtype=torch.long), zeros.clone(),
                             torch.ones(n, 1, dtype=torch.uint8), 1)
out = cpu_ops.attention(qkv, heads, kv, slots.clone(), rows, dim ** -0.5, split=False)
assert torch.equal(out.view(n, heads, dim), kv[1].unsqueeze(1).expand(n, heads, dim))  # one key: its value
print("ok")
"""


def test_a_step_of_many_rows_needs_no_stack():
    """The step's task and tile indices live in the caller's scratch: on the stack, 20000 rows of 8
    query heads a KV head took 4 MB and overflowed a 1 MB stack (a segfault)."""
    cpu_kernels.library()  # built here, not in the child with its small stack

    def small_stack():
        resource.setrlimit(resource.RLIMIT_STACK, (1 << 20, resource.getrlimit(resource.RLIMIT_STACK)[1]))

    run = subprocess.run([sys.executable, "-c", MANY_ROWS], preexec_fn=small_stack, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", (run.returncode, run.stderr[-2000:])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_llama(Path(tmp_path_factory.mktemp("tiny")))


def _logits(folder, kernels: bool, inputs_embeds=None):
    model = load_model(Checkpoint(folder, "t"), cpu_kernels=kernels)
    cache = model.make_cache(16, block_size=4)
    batch = RaggedBatch.build([SeqChunk("a", [4, 5, 6], 0, num_logits=1)], cache)
    return model(batch, cache, inputs_embeds=inputs_embeds)


def test_a_float64_default_dtype_changes_nothing(tiny):
    want = _logits(tiny, True)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        got = _logits(tiny, True)
    finally:
        torch.set_default_dtype(default)
    assert got.dtype == torch.float32 and torch.equal(got, want)


def test_the_callers_inputs_embeds_stay_as_they_were(tiny):
    embeds = torch.randn(3, load_model(Checkpoint(tiny, "t")).config.hidden_size)
    kept = embeds.clone()
    _logits(tiny, True, embeds)
    assert torch.equal(embeds, kept)


def test_arguments_the_c_code_cannot_read_are_refused():
    with pytest.raises(AssertionError):
        cpu_ops.rms_norm(torch.randn(2, 3, 64), torch.ones(64), 1e-5)  # 3-D
    with pytest.raises(AssertionError):
        cpu_ops.rms_norm(torch.randn(2, 64), torch.ones(16), 1e-5)  # a short weight
    with pytest.raises(AssertionError):
        cpu_ops.add_rms_norm(torch.randn(2, 64), torch.randn(2, 64), torch.ones(64, dtype=torch.float16), 1e-5)
    qkv = torch.randn(2, 3, 8, dtype=torch.float64)
    with pytest.raises(AssertionError):
        cpu_ops.rope_store_kv(qkv, torch.ones(2, 8), torch.zeros(2, 8), torch.arange(2), torch.zeros(2, 4, 8), 1)
    for in_features in (16, 40):  # not whole 32-blocks: the kernels would drop the tail or divide by zero
        nb = in_features // 32
        with pytest.raises(AssertionError, match="whole 32-blocks"):
            PackedWeight("q8_0", torch.zeros(4, nb, 36, dtype=torch.uint8), 4, in_features)
        with pytest.raises(AssertionError, match="whole 32-blocks"):
            FastWeight("q8_0", torch.zeros(1, 16 * nb * 34, dtype=torch.uint8), 4, in_features)
