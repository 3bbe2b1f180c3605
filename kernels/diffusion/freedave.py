"""FreeDave: several static steps per model call, with output identical to static decoding.

From the scores of the current canvas (at step t) the drafts replay the next static steps without
new logits: draft 1 is the next static state exactly, draft k the state after k steps had the logits
not changed. One batched forward scores every draft; then the fixed-point chain accepts: the target
of draft j is one static step from draft j with draft j's own logits, and draft j + 1 is accepted while
it equals the target of draft j (the accepted one is then the static state of that step exactly).
The accepted draft's logits are the next round's scores, so a call advances 1..K static steps and
FreeDave never calls the model more often than static decoding.
"""

from __future__ import annotations

import torch

from specray.kernels.diffusion.decoding import CanvasPlan, Scores, static_step


def build_drafts(canvas: torch.Tensor, scores: Scores, plan: CanvasPlan, step: int, num_drafts: int,
                 mask_token_id: int) -> list[torch.Tensor]:
    """canvas [length] at `step` -> drafts [length] each, draft k = k static steps on `scores`
    (fewer than num_drafts where the canvas has fewer steps left)."""
    drafts, draft = [], canvas
    for k in range(min(num_drafts, plan.num_steps - step)):
        draft = static_step(draft, scores, plan, step + k, mask_token_id)
        drafts.append(draft)
    return drafts


def accept(drafts: list[torch.Tensor], draft_scores: list[Scores | None], plan: CanvasPlan, step: int,
           mask_token_id: int) -> int:
    """-> how many static steps the round advances (the accepted draft's number, 1-based).

    `draft_scores[j]` scores drafts[j] (the canvas at step + j + 1); the last draft may have none when
    it is the final canvas."""
    best = 1  # draft 1 is the next static state by construction
    while best < len(drafts):
        scores = draft_scores[best - 1]
        assert scores is not None
        target = static_step(drafts[best - 1], scores, plan, step + best, mask_token_id)
        if not torch.equal(target, drafts[best]):
            break
        best += 1
    return best
