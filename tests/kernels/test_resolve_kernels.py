"""`kernels: auto`: the fast mode for a GGUF target on a CPU in fp32 (llama.cpp's numerics for those
weights), the exact mode for anything else; an explicit mode is kept, a wrong one refused."""

import pytest
import torch

from specray.kernels.loader import is_gguf_model, resolve_kernels


@pytest.mark.parametrize("model, device, dtype, want", [
    ("smollm2-135m", "cpu", torch.float32, "fast"),
    ("/models/any.Q4_1.gguf", "cpu", "float32", "fast"),
    ("smollm2-135m", "cpu", "auto", "fast"),  # a config's dtype auto is fp32
    ("smollm2-135m", "cuda", torch.float32, "exact"),
    ("smollm2-135m", "cuda:1", "float32", "exact"),
    ("smollm2-135m", "cpu", torch.bfloat16, "exact"),
    ("smollm2-135m", "cpu", "float16", "exact"),
    ("/models/hf-folder", "cpu", torch.float32, "exact"),  # Hugging Face weights stay equal to transformers
    ("smollm2-135m-dllm", "cpu", torch.float32, "exact"),  # a diffusion LM has no GGUF blocks
    ("smollm2-135m-eagle", "cpu", torch.float32, "exact"),
])
def test_auto_picks_fast_for_gguf_weights_on_a_cpu_in_fp32(model, device, dtype, want):
    assert resolve_kernels("auto", model, device, dtype) == want


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_an_explicit_mode_is_kept(mode):
    assert resolve_kernels(mode, "/models/hf-folder", "cuda", torch.bfloat16) == mode


@pytest.mark.parametrize("bad", ["turbo", "", None, "Auto", 1])
def test_a_wrong_mode_is_refused_naming_the_choices(bad):
    with pytest.raises(ValueError, match="kernels must be one of .*auto.*exact.*fast"):
        resolve_kernels(bad, "smollm2-135m")


def test_is_gguf_model_takes_names_only():
    assert is_gguf_model("smollm2-135m") and is_gguf_model("x.gguf")
    assert not is_gguf_model(["x.gguf"]) and not is_gguf_model(None) and not is_gguf_model("x.gguf/")
