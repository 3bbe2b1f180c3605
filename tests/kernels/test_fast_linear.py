"""The fast numeric modes' projections: the layout round trip, the C kernel against the torch
specification (8-bit activations, or two 8-bit parts in fast16; integer dot products), row
independence, non-finite inputs."""

import warnings

import pytest
import torch

from specray.kernels import fast_linear as fl
from specray.kernels import quant_linear as ql
from specray.kernels.loader import Checkpoint, load_model

from helpers import gguf_exact

needs_kernel = pytest.mark.skipif(not ql.kernel_available(), reason="no C compiler for the fast kernel")


def packed_weight(kind, out=37, blocks=5, seed=0) -> ql.PackedWeight:
    torch.manual_seed(seed)
    return ql.pack_exact(gguf_exact(torch.randn(out, 32 * blocks), kind))


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
@pytest.mark.parametrize("blocks", [1, 2, 3, 4, 5, 8, 18])
def test_fast_layout_holds_the_blocks_values(kind, blocks):
    packed = packed_weight(kind, blocks=blocks)
    fw = fl.pack_fast(packed)
    assert fw.nbytes == -(-packed.out_features // fl.TILE) * fl.TILE * blocks * fl.BLOCK_BYTES[kind]  # padded tiles
    q, d, m = fl.weight_values(fw)  # [out, nb, 32], [out, nb], [out, nb]
    values = (d.unsqueeze(-1) * q + m.unsqueeze(-1)).reshape(packed.out_features, -1)
    assert torch.equal(values, ql.dequantize(packed).double())


def test_activation_quantisation_by_hand():
    x = torch.zeros(2, 64)
    x[0, :4] = torch.tensor([1.0, -0.5, 0.25, 2.0])  # amax 2: scale 63.5, q = 63.5 -> 64 (half to even)
    x[1, 32] = float("nan")
    q, d, s = fl.quantize_activations(x)
    assert q[0, 0, :4].tolist() == [64.0, -32.0, 16.0, 127.0]  # 63.5 rounds to 64, 31.75 to 32, 15.875 to 16
    assert d[0, 0].item() == pytest.approx(2 / 127) and s[0, 0] == d[0, 0] * (64 - 32 + 16 + 127)
    assert d[0, 1] == 0 and not q[0, 1].any()  # an all-zero block
    assert torch.isnan(d[1, 1]) and not q[1, 1].any() and d[1, 0] == 0


def test_two_part_activations_by_hand():
    """fast16: the second part quantises what the first leaves, x - dx * q, rounded once."""
    x = torch.zeros(1, 32)
    x[0, :3] = torch.tensor([1.0, 0.3, -2.0])  # amax 2: dx = 2 / 127, q = 64, 19, -127
    (q, d, _), (q2, d2, _) = fl.quantize_two_part(x)
    assert q[0, 0, :3].tolist() == [64.0, 19.0, -127.0]
    left = torch.tensor([1.0, 0.3, -2.0], dtype=torch.float64) - d[0, 0].double() * q[0, 0, :3].double()
    assert d2[0, 0].item() == pytest.approx(left.abs().max().item() / 127)
    assert (q2[0, 0, :3].double() * d2[0, 0] - left).abs().max() <= d2[0, 0] / 2 + 1e-12
    assert q[0, 0, 3:].abs().sum() == 0 and q2[0, 0, 3:].abs().sum() == 0
    x[0, 5] = float("nan")  # a non-finite block: both parts NaN scales, so the output is NaN
    (_, d, _), (_, d2, _) = fl.quantize_two_part(x)
    assert torch.isnan(d[0, 0]) and torch.isnan(d2[0, 0])


@needs_kernel
@pytest.mark.parametrize("parts", [1, 2])
@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
@pytest.mark.parametrize("blocks", [1, 2, 3, 5, 8, 18, 33, 48])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9, 17])
def test_kernel_matches_the_integer_reference(kind, blocks, rows, parts):
    fw = fl.pack_fast(packed_weight(kind, blocks=blocks, seed=rows), parts)
    x = torch.randn(rows, fw.in_features) * torch.rand(rows, fw.in_features) ** 4  # uneven magnitudes
    got = fl.fast_linear(x, fw)  # [rows, out]
    want = fl.reference_linear(x, fw)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
def test_fast_mode_stays_close_to_the_exact_mode(kind):
    """A different model, not a different answer: the 8-bit activations move outputs by about 1 %."""
    packed = packed_weight(kind, out=64, blocks=18)
    x = torch.randn(6, packed.in_features)
    exact = ql.reference_linear(x, packed)
    fast = fl.fast_linear(x, fl.pack_fast(packed))
    assert not torch.equal(fast, exact)
    assert (fast - exact).norm() / exact.norm() < 0.02
    # fast16: the second part takes the first's rounding error down by about 250 times
    fast16 = fl.fast_linear(x, fl.pack_fast(packed, parts=2))
    assert (fast16 - exact).norm() / exact.norm() < 1e-4
    assert (fast16 - exact).norm() < (fast - exact).norm() / 100


@needs_kernel
@pytest.mark.parametrize("parts", [1, 2])
@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
def test_kernel_rows_do_not_depend_on_batch_or_threads(kind, parts):
    """The same bits alone (decode) or among 20 rows (20 or 40 activation rows: chunks of 16 and a
    remainder on AVX-512, of 4 on AVX2), with 1 or 2 threads; 301 features leave a remainder after
    every feature grouping."""
    fw = fl.pack_fast(packed_weight(kind, out=301, blocks=7), parts)
    x = torch.randn(20, fw.in_features)
    together = fl.fast_linear(x, fw)
    alone = torch.cat([fl.fast_linear(x[i:i + 1], fw) for i in range(20)])
    assert torch.equal(together, alone)
    assert torch.equal(fl.fast_linear(x[5:8], fw), together[5:8])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(fl.fast_linear(x, fw), together)
    finally:
        torch.set_num_threads(threads)


@needs_kernel
@pytest.mark.parametrize("parts", [1, 2])
def test_non_finite_rows_stay_in_their_row(parts):
    fw = fl.pack_fast(packed_weight("q4_1", out=16, blocks=3), parts)
    x = torch.randn(3, fw.in_features)
    clean = fl.fast_linear(x, fw)
    x[1, 40] = float("inf")
    x[2].zero_()
    got = fl.fast_linear(x, fw)
    assert torch.equal(got[0], clean[0])
    assert torch.isnan(got[1]).all()
    assert torch.equal(got[2], torch.zeros(16))


@needs_kernel
@pytest.mark.parametrize("mode", ["fast", "fast16"])
def test_the_fast_mode_says_when_no_weight_takes_it(tiny_target, tiny_gguf_target, mode):
    """A Hugging Face checkpoint's weights pack as their own values, which the fast modes' quantised
    activations do not apply to: loading one with kernels='fast' says so; a GGUF's does not."""
    with pytest.warns(UserWarning, match="found no GGUF"):
        model = load_model(Checkpoint(tiny_target, "t"), kernels=mode)
    assert model.packed_weights and not any(isinstance(p, fl.FastWeight) for p in model.packed_weights.values())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = load_model(Checkpoint(tiny_gguf_target, "t"), kernels=mode)
    assert all(isinstance(p, fl.FastWeight) and p.parts == (2 if mode == "fast16" else 1)
               for p in model.packed_weights.values())


def test_auto_kernels_take_fast16_for_a_gguf_target_on_a_cpu_in_fp32(tiny_target):
    from specray.kernels.loader import resolve_kernels

    assert resolve_kernels("auto", "smollm2-135m") == "fast16"
    assert resolve_kernels("auto", "/models/x.gguf", "cpu:0", "float32") == "fast16"
    assert resolve_kernels("auto", "smollm2-135m", "cuda") == "exact"
    assert resolve_kernels("auto", "smollm2-135m", "cpu", torch.bfloat16) == "exact"
    assert resolve_kernels("auto", str(tiny_target)) == "exact"  # Hugging Face weights: transformers' numbers
    assert resolve_kernels("auto", "smollm2-135m-dllm") == "exact"  # a diffusion LM
    assert resolve_kernels("fast", str(tiny_target)) == "fast"  # a named mode is taken as named
    with pytest.raises(ValueError, match="kernels must be one of"):
        resolve_kernels("int4", "smollm2-135m")
