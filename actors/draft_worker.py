"""DraftWorker: owns a drafter and each sequence's committed history; proposes draft tokens."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specray.actors.messages import DraftItem, SeqSpec
from specray.actors.specs import DraftSpec
from specray.kernels.drafters.base import Drafter, DraftRequest
from specray.kernels.drafters.registry import build_drafter
from specray.kernels.proposal import Proposal
from specray.kernels.sampling import make_generator

DRAFT_SEED_SALT = 0x5D5EED  # draft draws use their own stream so target draws stay independent
DRAFT_GROUP_SEED = 0x6A7E  # every rank of a draft group draws the same unseeded stream


@dataclass
class _DraftSeq:
    spec: SeqSpec
    generator: torch.Generator | None
    token_ids: list[int] = field(default_factory=list)


class DraftWorker:
    """Plain class; Ray places it in cluster/. Usable in-process."""

    def __init__(self, drafter: Drafter):
        self.drafter = drafter
        self.seqs: dict[object, _DraftSeq] = {}

    @classmethod
    def from_spec(cls, spec: DraftSpec) -> "DraftWorker":
        if spec.threads:
            torch.set_num_threads(spec.threads)
        workers = None
        if spec.group_size > 1:  # a layer-parallel draft group: join it (blocks until every rank has)
            from specray.kernels.tensor_parallel import init_distributed

            torch.manual_seed(DRAFT_GROUP_SEED)  # unseeded draws stay equal on every rank
            device = torch.device(spec.device)
            if device.type == "cuda" and device.index is not None:
                torch.cuda.set_device(device)  # NCCL talks from the current device
            workers = init_distributed(spec.group_rank, spec.group_size, spec.dist_init_method, spec.dist_backend,
                                       spec.device)
        return cls(build_drafter(spec, workers))

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
