"""DraftWorker: owns a drafter and each sequence's committed history; proposes draft tokens."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specray.actors.messages import DraftItem, SeqSpec
from specray.actors.specs import DraftSpec
from specray.kernels.drafters.base import DraftRequest, Drafter
from specray.kernels.drafters.draft_model import DraftModelDrafter
from specray.kernels.drafters.ngram import NgramDrafter
from specray.kernels.drafters.tree_draft import TreeDraftModelDrafter
from specray.kernels.drafters.tree_shapes import TreeSpec
from specray.kernels.drafters.vocab_trim import VOCAB_TRIM_FILE, VocabTrimDrafter, load_vocab_trim
from specray.kernels.loader import DTYPES, load_model, resolve
from specray.kernels.proposal import Proposal
from specray.kernels.sampling import make_generator

DRAFT_SEED_SALT = 0x5D5EED  # draft draws use their own stream so target draws stay independent


@dataclass
class _DraftSeq:
    spec: SeqSpec
    generator: torch.Generator | None
    token_ids: list[int] = field(default_factory=list)


def build_drafter(method: str, model: str | None = None, num_layers: int | None = None,
                  prompt_lookup_min: int = 1, prompt_lookup_max: int = 4,
                  dtype: torch.dtype = torch.float32, device: str = "cpu", num_blocks: int = 2048,
                  vocab_trim: int | None = None, tree: dict | None = None, aded: dict | None = None,
                  quantization: str | None = None, lookup_first: bool | dict | None = None) -> Drafter:
    """`vocab_trim`: None uses the draft folder's recommended VocabTrim size (if it has a table),
    0 turns VocabTrim off, k keeps the k most frequent tokens (kernels/drafters/vocab_trim.py).
    `quantization`: "q8_0" rounds the draft's weights to Q8_0 blocks (`round_weights_to_q8_0`),
    "none" keeps them; None means q8_0 where the draft runs on CPU in fp32.
    `tree` (speculative_config['tree']) makes a draft model grow trees; `aded` holds ADED's options.
    `lookup_first` (true or LookupOptions' keys) puts prompt lookup in front of a draft model."""
    if lookup_first not in (None, False):
        from specray.kernels.drafters.hybrid import LookupFirstDrafter, LookupOptions

        if method not in ("draft_model", "eagle"):
            raise ValueError(f"'lookup_first' needs method 'draft_model' or 'eagle', got {method!r}")
        options = LookupOptions.from_dict(lookup_first)
        inner = build_drafter(method, model, num_layers, prompt_lookup_min, prompt_lookup_max, dtype, device,
                              num_blocks, vocab_trim, tree, aded, quantization)
        return LookupFirstDrafter(inner, options)
    if tree is not None and method not in ("draft_model", "eagle"):
        raise ValueError(f"speculative_config['tree'] needs method 'draft_model' or 'eagle', got {method!r}")
    if method == "aded":
        from specray.kernels.drafters.aded import AdedDrafter

        return AdedDrafter.from_options(aded or {}, tokenizer_source=model)
    if method == "ngram":
        return NgramDrafter(prompt_lookup_min, prompt_lookup_max)
    if method == "eagle":
        return _eagle_drafter(model, dtype, device, num_blocks, vocab_trim, quantization, tree)
    if method == "draft_model":
        if model is None:
            raise ValueError("method 'draft_model' needs speculative_config['model']")
        checkpoint = resolve(model)
        k = default_vocab_trim(checkpoint.path) if vocab_trim is None else vocab_trim
        draft = load_model(checkpoint, dtype, device, num_layers, gemv_weights=False if k else None)
        if quantization is None:
            quantization = "q8_0" if str(device) == "cpu" and dtype == torch.float32 else "none"
        if quantization == "q8_0":  # before trimming: the kept head rows are then exact blocks
            draft.round_weights_to_q8_0()
        elif quantization != "none":
            raise ValueError(f"draft quantization must be 'q8_0' or 'none', got {quantization!r}")
        ids = load_vocab_trim(checkpoint.path, k) if k else None
        if tree is not None:
            drafter = TreeDraftModelDrafter(draft, TreeSpec.from_dict(tree), num_blocks, vocab_trim_ids=ids)
        elif k:
            drafter = VocabTrimDrafter(draft, ids, num_blocks)
        else:
            return DraftModelDrafter(draft, num_blocks)
        if k and str(device) == "cpu":  # GEMV copies after trimming: the full head's is never built
            draft.add_gemv_weights()
        return drafter
    raise ValueError(f"unknown speculative method {method!r}; choose 'ngram', 'draft_model', 'eagle' or 'aded'")


def _eagle_drafter(model: str | None, dtype, device, num_blocks: int, vocab_trim: int | None,
                   quantization: str | None, tree: dict | None) -> Drafter:
    from specray.kernels.drafters.eagle import EagleDrafter, eagle_target, is_eagle_folder, load_eagle

    if model is None:
        raise ValueError("method 'eagle' needs speculative_config['model'] (a feature-level draft folder)")
    checkpoint = resolve(model)
    if not is_eagle_folder(checkpoint.path):
        raise ValueError(f"{model!r} is not a feature-level draft (no eagle.json); use method 'draft_model'")
    draft = load_eagle(checkpoint.path, resolve(eagle_target(checkpoint.path)).path, dtype, device)
    if str(device) == "cpu" and dtype == torch.float32:
        draft.enable_cpu_kernels()
    if (quantization or ("q8_0" if str(device) == "cpu" and dtype == torch.float32 else "none")) == "q8_0":
        draft.round_weights_to_q8_0()
    elif quantization not in (None, "none"):
        raise ValueError(f"draft quantization must be 'q8_0' or 'none', got {quantization!r}")
    k = default_vocab_trim(checkpoint.path) if vocab_trim is None else vocab_trim
    drafter = EagleDrafter(draft, num_blocks, vocab_trim_ids=load_vocab_trim(checkpoint.path, k) if k else None)
    if tree is None:
        return drafter
    from specray.kernels.drafters.eagle_tree import EagleTreeDrafter

    return EagleTreeDrafter(drafter, TreeSpec.from_dict(tree))


def default_vocab_trim(folder) -> int:
    """The VocabTrim size a draft folder recommends (`distill.json`, or `eagle.json` for a
    feature-level draft), 0 when it has no table."""
    import json
    from pathlib import Path

    folder = Path(folder)
    info = next((folder / n for n in ("distill.json", "eagle.json") if (folder / n).exists()), None)
    if not (folder / VOCAB_TRIM_FILE).exists() or info is None:
        return 0
    return int(json.loads(info.read_text()).get("vocab_trim_k") or 0)


class DraftWorker:
    """Plain class; Ray places it in cluster/. Usable in-process."""

    def __init__(self, drafter: Drafter):
        self.drafter = drafter
        self.seqs: dict[object, _DraftSeq] = {}

    @classmethod
    def from_spec(cls, spec: DraftSpec) -> "DraftWorker":
        if spec.threads:
            torch.set_num_threads(spec.threads)
        return cls(build_drafter(spec.method, spec.model, spec.num_layers, spec.prompt_lookup_min,
                                 spec.prompt_lookup_max, DTYPES[spec.dtype], spec.device, spec.num_blocks,
                                 vocab_trim=spec.vocab_trim, tree=spec.tree, aded=spec.aded,
                                 quantization=spec.quantization, lookup_first=spec.lookup_first))

    def ping(self) -> bool:
        return True

    def _absorb(self, item: DraftItem) -> _DraftSeq:
        if item.spec is not None:
            seed = None if item.spec.seed is None else item.spec.seed ^ DRAFT_SEED_SALT
            self.seqs[item.seq_id] = _DraftSeq(item.spec, make_generator(seed))
        seq = self.seqs[item.seq_id]
        seq.token_ids.extend(item.committed_delta)
        return seq

    def propose(self, items: list[DraftItem]) -> list[Proposal]:
        """Apply each item's calibration delta, then draft up to `num_draft_tokens` per sequence."""
        requests = []
        for item in items:
            seq = self._absorb(item)
            requests.append(DraftRequest(item.seq_id, seq.token_ids, item.num_draft_tokens,
                                         seq.spec.sampling, seq.generator, item.verify_budget, item.features))
        return self.drafter.propose(requests)

    def release(self, seq_id: object) -> None:
        self.seqs.pop(seq_id, None)
        self.drafter.release(seq_id)
