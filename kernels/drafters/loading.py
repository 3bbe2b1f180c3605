"""Loading a draft checkpoint into a drafter: the `draft_model` and `eagle` methods' builders.

Both share the draft's numeric mode (`draft_quantization`) and VocabTrim size (`draft_vocab_trim`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specray.kernels.drafters.base import Drafter
from specray.kernels.drafters.draft_model import DraftModelDrafter
from specray.kernels.drafters.eagle import EagleDrafter, eagle_target, is_eagle_folder, load_eagle
from specray.kernels.drafters.eagle_tree import EagleTreeDrafter
from specray.kernels.drafters.options import DRAFT_QUANTIZATIONS, DraftOptions
from specray.kernels.drafters.tree_draft import TreeDraftModelDrafter
from specray.kernels.drafters.tree_shapes import TreeSpec
from specray.kernels.drafters.vocab_trim import VOCAB_TRIM_FILE, VocabTrimDrafter, load_vocab_trim
from specray.kernels.layer_parallel import LayerGroups
from specray.kernels.loader import DTYPES, load_model, resolve


def default_vocab_trim(folder) -> int:
    """The VocabTrim size a draft folder recommends (`distill.json`, or `eagle.json` for a
    feature-level draft), 0 when it has no table."""
    folder = Path(folder)
    info = next((folder / n for n in ("distill.json", "eagle.json", "longspec.json") if (folder / n).exists()), None)
    if not (folder / VOCAB_TRIM_FILE).exists() or info is None:
        return 0
    return int(json.loads(info.read_text()).get("vocab_trim_k") or 0)


def _cpu_fp32(options: DraftOptions) -> bool:
    """The C kernels' mode: a CPU draft in fp32."""
    return str(options.device) == "cpu" and DTYPES[options.dtype] == torch.float32


def draft_rounding(options: DraftOptions) -> str | None:
    """`draft_quantization`: "q8_0" or "q4_1" rounds the draft's weights to those blocks, "none"
    keeps them; None means q8_0 where the draft runs on CPU in fp32 (the packed C kernels' mode).
    -> the blocks to round to, or None."""
    mode = options.draft_quantization
    if mode is None:
        mode = "q8_0" if _cpu_fp32(options) else "none"
    if mode not in DRAFT_QUANTIZATIONS:
        raise ValueError(f"draft quantization must be one of {DRAFT_QUANTIZATIONS}, got {mode!r}")
    return None if mode == "none" else mode


def _vocab_trim_ids(options: DraftOptions, folder: Path) -> torch.Tensor | None:
    k = default_vocab_trim(folder) if options.draft_vocab_trim is None else options.draft_vocab_trim
    return load_vocab_trim(folder, k) if k else None


DRAFT_KINDS = {"eagle": "a feature-level draft (eagle.json)", "longspec": "a LongSpec draft (longspec.json)",
               "draft_model": "a standalone draft model"}


def draft_method(folder: Path) -> str:
    """The method a draft folder serves: eagle (eagle.json), longspec (longspec.json), else draft_model."""
    from specray.kernels.drafters.longspec_folder import is_longspec_folder

    return "eagle" if is_eagle_folder(folder) else "longspec" if is_longspec_folder(folder) else "draft_model"


def resolve_draft(method: str, model: str):
    """`model`'s checkpoint, refusing a draft that another method serves, naming that method:
    `draft_model` loading an eagle folder failed deep in its weights (a KeyError), a diffusion LM
    with transformers' advice to upgrade."""
    from specray.kernels.loader import is_diffusion_model

    if is_diffusion_model(model):
        raise ValueError(f"{model!r} is a diffusion LM: it serves on its own (FreeDave) and cannot be a draft")
    checkpoint = resolve(model)
    kind = draft_method(checkpoint.path)
    if kind != method:
        raise ValueError(f"{model!r} is {DRAFT_KINDS[kind]}, not {DRAFT_KINDS[method]}: use method {kind!r}")
    return checkpoint


def check_draft(target: Path, spec) -> None:
    """Every check of a draft against its target before anything loads (the engine and `specray
    serve` alike): it exists, suits the method, shares the vocabulary, fits the shape; ADED's
    corpus file exists (a deployment failed on it after Ray had started)."""
    corpus = (spec.aded or {}).get("corpus", "builtin") if spec is not None and spec.method == "aded" else None
    if isinstance(corpus, str) and corpus != "builtin" and not Path(corpus).is_file():
        raise ValueError(f"aded corpus {corpus!r} is not a file")
    if spec is None or spec.model is None:  # only methods that run a draft model take one
        return
    resolve_draft(spec.method, spec.model)
    check_draft_fits(target, spec.method, spec.model)
    check_draft_shape(target, spec)


# method -> (the config field a draft must share with its target, what a mismatch broke)
SHARED_WITH_TARGET = {
    # a standalone draft proposes over its own vocabulary: another failed every sampled request in
    # verification (a tensor size mismatch) and accepted nothing greedy
    "draft_model": ("vocab_size", "a draft must share the target's tokenizer"),
    # a feature-level draft reads the target's hidden states: another width failed every round at run
    # time (each logged, decoding target-only)
    "eagle": ("hidden_size", "an eagle draft reads the target's features: it was trained for another target"),
}


def check_draft_fits(target: Path, method: str, model: str | None) -> None:
    """The config field a method's draft must share with its target (SHARED_WITH_TARGET)."""
    if method not in SHARED_WITH_TARGET or model is None:
        return
    from specray.kernels.loader import hf_config

    field, why = SHARED_WITH_TARGET[method]
    want, got = getattr(hf_config(target), field), getattr(hf_config(resolve(model).path), field)
    if want != got:
        raise ValueError(f"the draft {model!r} has {field} {got}, the target's is {want}: {why}")


def check_draft_shape(target: Path, spec) -> None:
    """What the draft's worker would refuse only once deployed (`specray serve` failed after three
    attempts and hundreds of lines): EasySpec groups past the draft's middle layers, a LongSpec
    window past the target's context. `spec`: a SpeculativeConfig."""
    from specray.kernels.loader import hf_config

    if spec.draft_num_layers is not None and spec.model is not None:  # the loader's words named no key
        layers = hf_config(resolve(spec.model).path).num_hidden_layers
        if spec.draft_num_layers > layers:
            raise ValueError(f"draft_num_layers {spec.draft_num_layers} exceeds the draft {spec.model!r}'s "
                             f"{layers} layers")
    if spec.layer_parallel is not None and spec.model is not None:
        from specray.kernels.layer_parallel import LayerGroups

        layers = hf_config(resolve(spec.model).path).num_hidden_layers
        LayerGroups.uniform(min(layers, spec.draft_num_layers or layers), spec.layer_parallel)
    window = (spec.longspec or {}).get("window")
    if spec.method == "longspec" and window is not None:
        context = hf_config(target).max_position_embeddings
        if window > context:
            raise ValueError(f"the LongSpec window {window} exceeds the target's context {context}")


def refuse_partial_draft(folder: Path, name: str) -> None:
    """A feature-level or LongSpec draft has no model of its own (it reads the target's features,
    or its KV): asked for as the model to run, it failed deep in its weights (a KeyError)."""
    kind = draft_method(Path(folder))
    if kind != "draft_model":
        raise ValueError(f"{name!r} is {DRAFT_KINDS[kind]}, not a model that runs alone: serve its target and "
                         f"speculate with it (speculative_config={{'method': {kind!r}, 'model': {name!r}}}, or "
                         f"--speculative-method {kind} --draft-model {name})")


def build_draft_model(options: DraftOptions, workers=None) -> Drafter:
    """A standalone draft checkpoint: a chain, a VocabTrim chain, or a tree. `workers`: the TPGroup
    of a layer-parallel draft group (kernels/layer_parallel.py), this process being one rank."""
    if options.model is None:
        raise ValueError("method 'draft_model' needs speculative_config['model']")
    checkpoint = resolve_draft("draft_model", options.model)
    ids = _vocab_trim_ids(options, checkpoint.path)
    draft = load_model(checkpoint, DTYPES[options.dtype], options.device, options.draft_num_layers,
                       gemv_weights=False if ids is not None else None, row_invariant=False)
    rounding = draft_rounding(options)
    if rounding is not None:  # before trimming: the kept head rows are then exact blocks
        draft.round_weights(rounding, kernels="fast")
    blocks = (options.num_blocks, options.block_size)
    groups = None if options.layer_parallel is None else LayerGroups.uniform(len(draft.layers), options.layer_parallel)
    if options.tree is not None:
        drafter = TreeDraftModelDrafter(draft, TreeSpec.from_dict(options.tree), *blocks, vocab_trim_ids=ids,
                                        layer_groups=groups, workers=workers)
    elif ids is not None:
        drafter = VocabTrimDrafter(draft, ids, *blocks, layer_groups=groups, workers=workers)
    else:
        return DraftModelDrafter(draft, *blocks, layer_groups=groups, workers=workers)
    if ids is not None and str(options.device) == "cpu":  # GEMV copies after trimming: the full head's is never built
        draft.add_gemv_weights()
    return drafter


def build_eagle(options: DraftOptions) -> Drafter:
    """A feature-level draft folder (eagle.json) over its target's embedding and head."""
    if options.model is None:
        raise ValueError("method 'eagle' needs speculative_config['model'] (a feature-level draft folder)")
    checkpoint = resolve_draft("eagle", options.model)
    draft = load_eagle(checkpoint.path, resolve(eagle_target(checkpoint.path)).path, DTYPES[options.dtype],
                       options.device)
    if _cpu_fp32(options):
        draft.enable_cpu_kernels()
    rounding = draft_rounding(options)
    if rounding is not None:
        draft.round_weights(rounding, kernels="fast")
    drafter = EagleDrafter(draft, options.num_blocks, options.block_size,
                           vocab_trim_ids=_vocab_trim_ids(options, checkpoint.path))
    return drafter if options.tree is None else EagleTreeDrafter(drafter, TreeSpec.from_dict(options.tree))


def build_longspec(options: DraftOptions) -> Drafter:
    """A LongSpec draft folder (longspec.json) over its target's embedding and head."""
    from specray.kernels.drafters.longspec import LongSpecDrafter, LongSpecTreeDrafter
    from specray.kernels.drafters.longspec_folder import LongSpecOptions, load_longspec

    if options.model is None:
        raise ValueError("method 'longspec' needs speculative_config['model'] (a LongSpec draft folder)")
    checkpoint = resolve_draft("longspec", options.model)
    window = LongSpecOptions.from_dict(options.longspec).window
    layer, embed, head = load_longspec(checkpoint.path, window, DTYPES[options.dtype], options.device)
    drafter = LongSpecDrafter(layer, embed, head, _vocab_trim_ids(options, checkpoint.path))
    return drafter if options.tree is None else LongSpecTreeDrafter(drafter, TreeSpec.from_dict(options.tree))
