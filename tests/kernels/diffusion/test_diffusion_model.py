"""The diffusion runtime: both folder layouts against transformers without a causal mask, the fast
path against the float64 reference, row independence, and clear errors for unsupported folders."""

import json

import pytest
import torch
from diffusion_helpers import MASK, bidirectional_logits, hf_twin, save_tiny_dllm

from specray.kernels.config import UnsupportedModelError
from specray.kernels.diffusion.config import diffusion_config
from specray.kernels.diffusion.config import is_diffusion_folder
from specray.kernels.diffusion.weights import load_diffusion_model


@pytest.fixture(scope="module", params=["llada", "dream"])
def layout_model(request, tmp_path_factory):
    folder = save_tiny_dllm(tmp_path_factory.mktemp(request.param), request.param)
    return request.param, folder, load_diffusion_model(folder)


def _canvas(seed: int, n: int, masked_from: int) -> torch.Tensor:
    ids = torch.randint(3, MASK, (n,), generator=torch.Generator().manual_seed(seed))
    ids[masked_from:] = MASK
    return ids


def test_each_layout_matches_transformers_run_without_a_causal_mask(layout_model):
    layout, folder, model = layout_model
    assert is_diffusion_folder(folder) and model.config.layout == layout
    assert model.config.shift_logits == (layout == "dream")
    twin = hf_twin(layout)
    for seed, n in [(0, 9), (1, 23), (2, 40)]:
        ids = _canvas(seed, n, n // 2)
        ref = model.reference_logits(ids)
        torch.testing.assert_close(ref[1:], bidirectional_logits(twin, ids, model.config.shift_logits)[1:],
                                   atol=1e-4, rtol=0)
        fast = model.forward([ids], [(1, n)])[0]
        torch.testing.assert_close(fast.double(), ref[1:], atol=1e-4, rtol=0)


def test_attention_is_bidirectional(layout_model):
    """A later token changes an earlier position's logits (a causal model would not)."""
    _, _, model = layout_model
    ids = _canvas(3, 12, 12)
    changed = ids.clone()
    changed[-1] = (int(ids[-1]) + 1) % MASK
    a, b = model.forward([ids, changed], [(2, 3), (2, 3)])
    assert not torch.equal(a, b)


def test_a_canvas_gives_bit_identical_logits_alone_or_among_others(layout_model):
    """Row independence: FreeDave's drafts are scored in one call with other canvases and must give
    exactly the logits static decoding sees (so no argmax or confidence order can flip)."""
    _, _, model = layout_model
    canvases = [_canvas(s, n, n // 3) for s, n in [(4, 5), (5, 17), (6, 3), (7, 30), (8, 11)]]
    windows = [(1, n) for n in (5, 17, 3, 30, 11)]
    together = model.forward(canvases, windows)
    for canvas, window, logits in zip(canvases, windows, together):
        alone = model.forward([canvas], [window])[0]
        assert torch.equal(alone, logits)
        # a narrower window of the same canvas: the same rows, bit for bit
        assert torch.equal(model.forward([canvas], [(window[1] - 1, window[1])])[0], logits[-1:])


@pytest.fixture
def many_threads():
    """16 threads on any box: torch splits an elementwise op's elements by the thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(16)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_row_independence_holds_in_16_bit_weights(tmp_path, dtype, many_threads):
    """In 16 bits the library picks a GEMM's and a norm's reduction order by the shape: 92 of 220
    rows moved between a canvas alone and among others, and FreeDave then drifted from static decoding."""
    model = load_diffusion_model(save_tiny_dllm(tmp_path / "m", "llada", scale=6.0), dtype)
    canvases = [_canvas(s, n, n // 3) for s, n in [(4, 37), (5, 53), (6, 29), (7, 61), (8, 45)]]
    windows = [(1, c.shape[0]) for c in canvases]
    together = model.forward(canvases, windows)
    for canvas, window, logits in zip(canvases, windows, together):
        assert torch.equal(model.forward([canvas], [window])[0], logits)


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.pop("mask_token_id"), "mask_token_id"),
    (lambda c: c.update(alibi=True), "alibi"),
    (lambda c: c.update(activation_type="gelu"), "activation_type"),
    (lambda c: c.update(block_type="sequential"), "block_type"),
    (lambda c: c.update(model_type="bert"), "not a diffusion LM"),
])
def test_unsupported_llada_configs_are_clear_errors(tmp_path, edit, message):
    folder = save_tiny_dllm(tmp_path / "m", "llada")
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    with pytest.raises(UnsupportedModelError, match=message):
        diffusion_config(config)


def test_dream_variants_and_broken_weights_are_clear_errors(tmp_path):
    folder = save_tiny_dllm(tmp_path / "d", "dream")
    config = json.loads((folder / "config.json").read_text())
    with pytest.raises(UnsupportedModelError, match="sliding window"):
        diffusion_config({**config, "use_sliding_window": True})
    with pytest.raises(UnsupportedModelError, match="hidden_act"):
        diffusion_config({**config, "hidden_act": "gelu"})
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))
    with pytest.raises(UnsupportedModelError, match="shape"):
        load_diffusion_model(folder)
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(UnsupportedModelError, match="model.layers.2"):
        load_diffusion_model(folder)


def test_fast_path_argmaxes_match_the_reference_away_from_near_ties(layout_model):
    """Where the float64 reference's top two logits are within 1e-4 (a near-tie the fp32 path may
    order either way) the position is skipped, counted, and must stay rare."""
    _, _, model = layout_model
    canvases = [_canvas(s, n, n // 4) for s, n in [(10, 33), (11, 18), (12, 47)]]
    fast = model.forward(canvases, [(1, c.shape[0]) for c in canvases])
    compared = skipped = 0
    for canvas, logits in zip(canvases, fast):
        ref = model.reference_logits(canvas)[1:]
        top2 = ref.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 1e-4
        skipped += int((~clear).sum())
        compared += int(clear.sum())
        assert torch.equal(logits.argmax(-1)[clear], ref.argmax(-1)[clear])
    assert compared > 80 and skipped <= compared // 20
