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
    """The same bits alone (decode) or among 70 rows (70 or 140 activation rows: blocks of 64 read
    each tile once, in row chunks of 16 and a remainder on AVX-512, of 4 on AVX2), with 1 or 2
    threads; 301 features leave a remainder after every feature grouping."""
    fw = fl.pack_fast(packed_weight(kind, out=301, blocks=7), parts)
    x = torch.randn(70, fw.in_features)
    together = fl.fast_linear(x, fw)
    alone = torch.cat([fl.fast_linear(x[i:i + 1], fw) for i in range(70)])
    assert torch.equal(together, alone)
    assert torch.equal(fl.fast_linear(x[5:8], fw), together[5:8])
    assert torch.equal(fl.fast_linear(x[3:40], fw), together[3:40])
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


@needs_kernel
def test_auto_kernels_take_fast16_where_the_weights_are_gguf_blocks(tiny_target, tiny_gguf_target):
    """auto: fast16 on GGUF Q4_1/Q8_0 blocks on a CPU in fp32; exact, silently, on other weights
    (a Hugging Face checkpoint keeps transformers' numbers and its fp32 KV cache) or another dtype."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gguf = load_model(Checkpoint(tiny_gguf_target, "t"), kernels="auto")
        hf = load_model(Checkpoint(tiny_target, "t"), kernels="auto")
        bf16 = load_model(Checkpoint(tiny_gguf_target, "t"), torch.bfloat16, kernels="auto")
    assert gguf.kernel_mode == "fast16" and gguf.kv_dtype == torch.float16
    assert all(isinstance(p, fl.FastWeight) and p.parts == 2 for p in gguf.packed_weights.values())
    assert hf.kernel_mode == "exact" and hf.kv_dtype == torch.float32 and hf.packed_weights
    assert bf16.kernel_mode == "exact" and not bf16.packed_weights
    with pytest.raises(ValueError, match="kernels must be one of"):
        load_model(Checkpoint(tiny_gguf_target, "t"), kernels="int4")


@needs_kernel
def test_the_c_two_part_quantiser_is_the_reference_bit_for_bit():
    """fast16's activations in C (`specray_fast16_quantize`: 48 bytes a block, row 2r x's quantisation,
    row 2r + 1 its residual's) against `quantize_two_part`: the same int8 values and scales."""
    from specray.kernels import cpu_kernels

    torch.manual_seed(3)
    rows, n = 5, 32 * 6
    x = torch.randn(rows, n) * torch.rand(rows, n) ** 3
    x[1, 40] = float("nan")
    x[2, 64:96] = 0.0
    act = torch.zeros(cpu_kernels.library().specray_fast_scratch_bytes(2 * rows, n), dtype=torch.uint8)
    cpu_kernels.library().specray_fast16_quantize(x.data_ptr(), rows, n, act.data_ptr())
    blocks = act.view(2 * rows, n // 32, 48)  # q[32], dx, s, corr, padding
    for part, (q, d, s) in enumerate(fl.quantize_two_part(x)):
        got = blocks[part::2]  # [rows, nb, 48]
        assert torch.equal(got[..., :32].view(torch.int8).float(), q)
        for at, want in ((32, d), (36, s)):  # NaN scales where a block is not finite, in both
            scale = got[..., at:at + 4].contiguous().view(torch.float32).squeeze(-1)
            assert torch.equal(scale.nan_to_num(7.0), want.float().nan_to_num(7.0))
