"""Trees from a feature-level draft (RSD-C, RSD-S, SpecTr, top-k), grown as TreeDraftModelDrafter
grows them; each node's input reads its parent's predicted feature g (the root's children read the
g of the calibration's last row)."""

from __future__ import annotations

import torch

from specray.kernels.batch import SeqChunk
from specray.kernels.drafters.base import DraftRequest
from specray.kernels.drafters.eagle import EagleDrafter
from specray.kernels.drafters.tree_draft import TreeDraftModelDrafter
from specray.kernels.drafters.tree_shapes import TreeSpec


class EagleTreeDrafter(TreeDraftModelDrafter):
    name = "eagle"

    def __init__(self, base: EagleDrafter, tree: TreeSpec):
        self.base = base
        self.tree = tree
        # seq_id -> (g of the root [1, H], g of every node of the tree so far [num_nodes, H] or None)
        self._g: dict[object, tuple[torch.Tensor, torch.Tensor | None]] = {}

    def defer(self, requests: list[DraftRequest]) -> None:
        self.base.defer(requests)

    def _root_logits(self, requests: list[DraftRequest]) -> torch.Tensor:
        logits, g = self.base.calibrate(requests)
        drafting = [r for r in requests if r.num_draft_tokens > 0]
        self._g = {r.seq_id: (g[j:j + 1], None) for j, r in enumerate(drafting)}
        return logits

    def _context_len(self, seq_id: object) -> int:
        return self.base.states[seq_id].fed

    def _tree_logits(self, chunks: list[SeqChunk]) -> torch.Tensor:
        """Every node so far, each reading its parent's g -> logits [sum(num_nodes), vocab_size]."""
        model, inputs = self.base.model, []
        for c in chunks:
            root, nodes = self._g[c.seq_id]
            parents = [root[0] if p < 0 else nodes[p] for p in c.parents]  # parents precede children
            inputs.append(model.inputs(torch.stack(parents), c.token_ids))
        logits, g = self.base.forward(chunks, torch.cat(inputs))
        row0 = 0
        for c in chunks:
            self._g[c.seq_id] = (self._g[c.seq_id][0], g[row0:row0 + len(c.token_ids)])
            row0 += len(c.token_ids)
        return logits
