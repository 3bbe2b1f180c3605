"""VocabTrim: a draft model whose LM head keeps only a subset of the vocabulary.

The subset is the k most frequent tokens of target-generated text (stored beside the draft as
`vocab_trim.safetensors`, ids by descending frequency; a trim of size k keeps the first k). The
draft's head is cut to those rows, so a draft step reads k x hidden head weights instead of
vocab_size x hidden. The proposal distribution is the softmax over the subset (after the same
temperature / top-k / top-p processing), written back densely with zeros outside the subset, so
verification against the target stays exact: a token the draft cannot propose has p = 0 and
the residual norm(max(q - p, 0)) gives it its full target mass.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from specray.kernels.cpu_ops import argmax_rows
from specray.kernels.drafters.base import DraftRequest
from specray.kernels.drafters.draft_model import DraftModelDrafter, sample_step
from specray.kernels.model import LlamaModel

VOCAB_TRIM_FILE = "vocab_trim.safetensors"


def load_vocab_trim(folder: Path, k: int) -> torch.Tensor:
    """The first k token ids of the folder's VocabTrim table -> [k] int64."""
    from safetensors.torch import load_file

    path = Path(folder) / VOCAB_TRIM_FILE
    if not path.exists():
        raise ValueError(f"{folder} has no {VOCAB_TRIM_FILE}; train it with `specray distill` or turn "
                         "draft_vocab_trim off (0)")
    ids = load_file(str(path))["token_ids"].long()
    if not 1 <= k <= ids.numel():
        raise ValueError(f"draft_vocab_trim must be in [1, {ids.numel()}] for {folder}, got {k}")
    return ids[:k]


def trim_lm_head(model: LlamaModel, token_ids: torch.Tensor) -> None:
    """Replace the model's LM head by its rows `token_ids` [k]; logits become [num_logits, k]."""
    if model.vocab_parallel:
        raise ValueError("VocabTrim needs an unsharded draft LM head")
    ids = token_ids.to(model.lm_head.device)
    assert ids.dim() == 1 and ids.unique().numel() == ids.numel(), "VocabTrim ids must be distinct"
    head = nn.Parameter(model.lm_head.detach()[ids].clone(), requires_grad=False)  # [k, hidden_size]
    had_gemv = id(model.lm_head) in model.gemv_weights
    model.gemv_weights.pop(id(model.lm_head), None)
    packed = model.packed_weights.pop(id(model.lm_head), None)
    model.lm_head = head
    if had_gemv:
        model.gemv_weights[id(head)] = head.detach().t().contiguous()
    packed = model.pack_weight(head) if packed is not None else None  # kept rows stay exact blocks
    if packed is not None:
        model.packed_weights[id(head)] = packed


def expand_trimmed_logits(trimmed: torch.Tensor, token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """trimmed [rows, k] over `token_ids` [k] -> [rows, vocab_size] with -inf off the subset, so that
    argmax, softmax, top-k and top-p all act on the subset alone (probability exactly 0 elsewhere)."""
    logits = trimmed.new_full((trimmed.shape[0], vocab_size), float("-inf"))
    return logits.index_copy_(1, token_ids, trimmed)


class TrimmedVocab:
    """A trimmed head's kept token ids, ascending: the first maximum among them is then the first
    over the whole vocabulary, so a greedy draw needs no [rows, vocab_size] expansion."""

    def __init__(self, token_ids: torch.Tensor, vocab_size: int):
        self.token_ids = token_ids.sort().values  # [k]: trimmed row -> token id
        self.kept = self.token_ids.tolist()
        self.vocab_size = vocab_size

    def expand(self, trimmed: torch.Tensor) -> torch.Tensor:
        """[rows, k] -> [rows, vocab_size], -inf off the kept ids."""
        return expand_trimmed_logits(trimmed, self.token_ids, self.vocab_size)

    def draw(self, requests: list[DraftRequest], active: list[int], trimmed: torch.Tensor,
             drafts: list[list[int]], probs: list[list[torch.Tensor]]) -> None:
        """`sample_step` on logits [len(active), k] over the kept ids: an all-greedy step takes the
        argmax among them, a sampled one keeps the proposal distribution over the whole vocabulary,
        as verification reads it."""
        if all(requests[i].sampling.greedy for i in active):
            for i, row in zip(active, argmax_rows(trimmed).tolist(), strict=True):
                drafts[i].append(self.kept[row])
        else:
            sample_step(requests, active, self.expand(trimmed), drafts, probs)


def draw_head_rows(vocab: TrimmedVocab | None, requests: list[DraftRequest], active: list[int],
                   logits: torch.Tensor, drafts: list[list[int]], probs: list[list[torch.Tensor]]) -> None:
    """A chain's next tokens from a head's logits [len(active), vocab_size] (`sample_step`), or from a
    VocabTrim head's [len(active), k] (`TrimmedVocab.draw`)."""
    if vocab is None:
        sample_step(requests, active, logits, drafts, probs)
    else:
        vocab.draw(requests, active, logits, drafts, probs)


class VocabTrimDrafter(DraftModelDrafter):
    """A draft model over a trimmed head (DESIGN §3 'VocabTrim heads'); chains, and trees as the
    base of TreeDraftModelDrafter."""

    name = "draft_model_vocab_trim"

    def __init__(self, model: LlamaModel, token_ids: torch.Tensor, num_blocks: int = 2048, block_size: int = 16,
                 layer_groups=None, workers=None):
        self.vocab = TrimmedVocab(token_ids.to(model.lm_head.device), model.config.vocab_size)
        trim_lm_head(model, self.vocab.token_ids)
        super().__init__(model, num_blocks, block_size, layer_groups, workers)

    @property
    def token_ids(self) -> torch.Tensor:
        return self.vocab.token_ids

    def logits(self, batch, fuzzy: bool = False) -> torch.Tensor:
        return self.vocab.expand(self.forward(batch, fuzzy))  # [num_logits, vocab_size]

    def proposal_logits(self, batch, fuzzy: bool = False) -> torch.Tensor:
        return self.forward(batch, fuzzy)  # [num_logits, k]: `_draw` reads them

    def _draw(self, requests, active, logits, drafts, probs) -> None:
        self.vocab.draw(requests, active, logits, drafts, probs)
