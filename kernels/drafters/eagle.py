"""A feature-level draft (EAGLE-style): drafts from the target's own final hidden states.

Position i of the draft reads fc([f_i; E x_{i+1}]): f_i the target's post-norm hidden state at i
(the row its LM head reads), E the target's embedding. One decoder layer and a norm predict
g_{i+1} ~ f_{i+1}; the target's head on g_{i+1} is the proposal for x_{i+2}; later draft steps feed
g in place of f.

Calibration: the target returns f for every position it kept (`VerifyResult.features`), so each
round the drafter first feeds the positions whose f it newly got; that feed's last row proposes the
first draft token, so calibration costs no extra forward pass. Draft KV written from predicted g is
scratch: the valid length goes back to the positions fed from true f. Verification is unchanged,
so outputs stay exactly the target's, whatever the draft proposes.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from specray.kernels.batch import RaggedBatch, SeqChunk
from specray.kernels.config import ModelConfig
from specray.kernels.drafters.base import DraftRequest
from specray.kernels.drafters.vocab_trim import TrimmedVocab, draw_head_rows, trim_lm_head
from specray.kernels.model import LlamaModel
from specray.kernels.proposal import Proposal

EAGLE_FILE = "eagle.json"  # marks a folder as a feature-level draft and names its target


class EagleModel(LlamaModel):
    """The draft's layer(s) over the target's embedding and head, plus fc [H, 2H] on the input."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype = torch.float32, device="cpu"):
        super().__init__(config, dtype, device)
        self.fc = nn.Parameter(torch.empty(config.hidden_size, 2 * config.hidden_size, dtype=dtype, device=device))

    def projections(self) -> list[torch.Tensor]:
        return super().projections() + [self.fc]

    def inputs(self, features: torch.Tensor, token_ids: list[int]) -> torch.Tensor:
        """features [rows, H] (true f or predicted g) and the next tokens -> the layer's input [rows, H]."""
        emb = self.embed_tokens[torch.tensor(token_ids, dtype=torch.long, device=self.embed_tokens.device)]
        return self.linear(torch.cat([features.to(self.dtype), emb], dim=-1).contiguous(), self.fc)


def is_eagle_folder(folder: Path) -> bool:
    return (Path(folder) / EAGLE_FILE).exists()


def eagle_target(folder: Path) -> str:
    """The target a feature-level draft was trained on (its features are that target's)."""
    return json.loads((Path(folder) / EAGLE_FILE).read_text())["target"]


def load_eagle(folder: Path, target_folder: Path, dtype: torch.dtype = torch.float32,
               device: str = "cpu") -> EagleModel:
    """The draft folder's fc and layer(s), the target folder's embedding (also the tied head)."""
    from safetensors.torch import load_file

    from specray.kernels.loader import _read_safetensors, hf_config

    config = ModelConfig.from_hf(hf_config(folder))
    state = load_file(str(Path(folder) / "model.safetensors"))
    target = _read_safetensors(Path(target_folder))
    embed = target.get("model.embed_tokens.weight", target.get("embed_tokens.weight"))
    if embed is None or tuple(embed.shape) != (config.vocab_size, config.hidden_size):
        raise ValueError(f"{target_folder} has no embedding of shape {(config.vocab_size, config.hidden_size)} "
                         f"for the feature-level draft {folder}")
    head = target.get("lm_head.weight")  # untied targets: the proposal uses the target's own head
    config = dataclasses.replace(config, tie_word_embeddings=head is None)
    model = EagleModel(config, dtype, device)
    model.row_invariant = False  # a draft: its numbers only shape proposals
    model.load_hf_state_dict({"embed_tokens.weight": embed, **state, **({} if head is None else {"lm_head.weight": head})})
    with torch.no_grad():
        model.fc.copy_(state["fc.weight"])
    return model.eval()


@dataclass
class _EagleState:
    fed: int = 0  # positions whose draft KV came from the target's true features
    unfed: list[torch.Tensor] = field(default_factory=list)  # true features not fed yet, [rows, H] each


class EagleDrafter:
    name = "eagle"

    def __init__(self, model: EagleModel, num_blocks: int = 2048, block_size: int = 16,
                 vocab_trim_ids: torch.Tensor | None = None):
        self.vocab = None
        if vocab_trim_ids is not None:
            self.vocab = TrimmedVocab(vocab_trim_ids.to(model.lm_head.device), model.config.vocab_size)
            trim_lm_head(model, self.vocab.token_ids)
        self.model = model
        self.cache = model.make_cache(num_blocks, block_size)
        self.states: dict[object, _EagleState] = {}

    @property
    def token_ids(self) -> torch.Tensor | None:
        """The VocabTrim ids [k] (trimmed row -> token id), None without a trim."""
        return None if self.vocab is None else self.vocab.token_ids

    def defer(self, requests: list[DraftRequest]) -> None:
        """Keep the target features these requests carry for a later round, without a step (another
        drafter proposed for them this round)."""
        for r in requests:
            if r.features is not None:
                self.states.setdefault(r.seq_id, _EagleState()).unfed.append(r.features)

    def _calibrate(self, r: DraftRequest) -> tuple[SeqChunk, torch.Tensor]:
        """-> the chunk of positions whose true features arrived, and its input rows [rows, H]."""
        state = self.states.get(r.seq_id)
        if state is None:
            state = self.states[r.seq_id] = _EagleState()
        if r.features is not None:
            state.unfed.append(r.features)
        need = len(r.token_ids) - 1 - state.fed  # every committed position but the pending one
        have = sum(f.shape[0] for f in state.unfed)
        if have > need:
            raise ValueError(f"sequence {r.seq_id!r}: {have} target feature rows for {need} new positions")
        h = self.model.config.hidden_size
        # Fewer rows only after the draft side lost its state: the oldest positions read zeros
        # (weaker drafts for this sequence, outputs unchanged).
        feats = torch.cat([torch.zeros(need - have, h), *[f.float().cpu() for f in state.unfed]])  # [need, H]
        state.unfed = []
        tokens = r.token_ids[state.fed + 1:]  # x_{i+1} for each fed position i
        chunk = SeqChunk(r.seq_id, tokens, state.fed, num_logits=1 if r.num_draft_tokens else 0)
        return chunk, self.model.inputs(feats.to(self.model.embed_tokens.device), tokens)

    def forward(self, chunks: list[SeqChunk], inputs: torch.Tensor,
                trimmed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """inputs [num_tokens, H] -> proposal logits [num_logits, vocab_size] (with `trimmed`, over
        the VocabTrim ids alone: [num_logits, k]) and the predicted features g [num_logits, H] at
        those rows; valid lengths unchanged (tree chunks are scratch)."""
        batch = RaggedBatch.build(chunks, self.cache, self.model.embed_tokens.device)
        logits, feats = self.model(batch, self.cache, inputs_embeds=inputs, features=True)
        if self.vocab is not None and not trimmed:
            logits = self.vocab.expand(logits)
        return logits, feats[batch.logits_indices]

    def _step(self, chunks: list[SeqChunk], inputs: torch.Tensor,
              trimmed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward`, keeping the chunks' KV (their valid lengths advance)."""
        out = self.forward(chunks, inputs, trimmed)
        for c in chunks:
            self.cache.set_cached(c.seq_id, c.context_len + len(c.token_ids))
        return out

    def calibrate(self, requests: list[DraftRequest], trimmed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed every request's newly known positions -> the drafting requests' root logits
        [num drafting, vocab_size] (`trimmed`: [num drafting, k]) and predicted features g
        [num drafting, H]."""
        pairs = [self._calibrate(r) for r in requests]
        logits, g = self._step([c for c, _ in pairs], torch.cat([x for _, x in pairs]), trimmed)
        for r, (c, _) in zip(requests, pairs, strict=True):
            self.states[r.seq_id].fed = c.context_len + len(c.token_ids)
        return logits, g

    def propose(self, requests: list[DraftRequest]) -> list[Proposal]:
        if not requests:
            return []
        logits, g = self.calibrate(requests, trimmed=True)
        drafts: list[list[int]] = [[] for _ in requests]
        probs: list[list[torch.Tensor]] = [[] for _ in requests]
        active = [i for i, r in enumerate(requests) if r.num_draft_tokens > 0]
        while active:
            self._draw(requests, active, logits, drafts, probs)
            going = [j for j, i in enumerate(active) if len(drafts[i]) < requests[i].num_draft_tokens]
            if not going:
                break
            active = [active[j] for j in going]
            chunks = [SeqChunk(requests[i].seq_id, drafts[i][-1:], self.states[requests[i].seq_id].fed
                               + len(drafts[i]) - 1) for i in active]
            inputs = self.model.inputs(g[going], [drafts[i][-1] for i in active])
            logits, g = self._step(chunks, inputs, trimmed=True)
        for r in requests:  # KV from predicted features is scratch
            self.cache.set_cached(r.seq_id, self.states[r.seq_id].fed)
        return [Proposal(d, None if r.sampling.greedy or not p else torch.stack(p))
                for d, p, r in zip(drafts, probs, requests, strict=True)]

    def _draw(self, requests: list[DraftRequest], active: list[int], logits: torch.Tensor,
              drafts: list[list[int]], probs: list[list[torch.Tensor]]) -> None:
        """`sample_step`, or over the VocabTrim ids' logits [len(active), k] `TrimmedVocab.draw`."""
        draw_head_rows(self.vocab, requests, active, logits, drafts, probs)

    def release(self, seq_id: object) -> None:
        self.states.pop(seq_id, None)
        self.cache.free(seq_id)
