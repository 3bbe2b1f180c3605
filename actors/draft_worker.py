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
                  tree: dict | None = None, aded: dict | None = None) -> Drafter:
    """`tree` (speculative_config['tree']) makes a draft model grow trees; `aded` holds ADED's options."""
    if tree is not None and method != "draft_model":
        raise ValueError(f"speculative_config['tree'] needs method 'draft_model', got {method!r}")
    if method == "aded":
        from specray.kernels.drafters.aded import AdedDrafter

        return AdedDrafter.from_options(aded or {}, tokenizer_source=model)
    if method == "ngram":
        return NgramDrafter(prompt_lookup_min, prompt_lookup_max)
    if method == "draft_model":
        if model is None:
            raise ValueError("method 'draft_model' needs speculative_config['model']")
        draft = load_model(resolve(model), dtype, device, num_layers)
        if tree is not None:
            return TreeDraftModelDrafter(draft, TreeSpec.from_dict(tree), num_blocks)
        return DraftModelDrafter(draft, num_blocks)
    raise ValueError(f"unknown speculative method {method!r}; choose 'ngram', 'draft_model' or 'aded'")


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
                                 tree=spec.tree, aded=spec.aded))

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
                                         seq.spec.sampling, seq.generator, item.verify_budget))
        return self.drafter.propose(requests)

    def release(self, seq_id: object) -> None:
        self.seqs.pop(seq_id, None)
        self.drafter.release(seq_id)
