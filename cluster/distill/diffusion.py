"""`specray distill --kind diffusion`: a small diffusion LM (DLLM) that serves on its own.

Same data phase (the target's responses); then:
2. init: the Dream layout (logits shifted by one) over an autoregressive model's weights, by default
   the packaged `smollm2-135m-draft` (Dream's recipe: start from an AR model, train to unmask);
3. train: the masked-diffusion objective (cluster/distill/diffusion_train.py), checkpoints in
   OUT/dllm_checkpoint.pt (a re-run resumes);
4. save OUT/dllm: a Dream-layout folder (fp16) with the tokenizer and eval.json;
5. evaluate: held-out masked-token loss before and after training, and greedy samples.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path

import torch

from specray.cluster.distill.data import load_samples
from specray.cluster.distill.diffusion_train import diffusion_loss, examples, masked_token_loss
from specray.cluster.distill.train import ScheduleConfig, run_training
from specray.kernels.diffusion.config import diffusion_config
from specray.kernels.diffusion.decoding import DecodeOptions
from specray.kernels.diffusion.engine import decode_greedy
from specray.kernels.diffusion.model import DiffusionModel
from specray.kernels.diffusion.weights import dream_state, load_state

DEFAULT_INIT = "smollm2-135m-draft"
MASK_TOKEN = "<empty_output>"  # a SmolLM2 special token chat text never holds
BLOCK = 32
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def dream_config_from_llama(raw: dict, mask_token_id: int) -> dict:
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings", "tie_word_embeddings",
            "vocab_size", "bos_token_id", "eos_token_id")
    return {"model_type": "Dream", "architectures": ["DreamModel"], **{k: raw[k] for k in keys if k in raw},
            "hidden_act": "silu", "mask_token_id": mask_token_id, "torch_dtype": "float16"}


def init_dllm(folder: Path, mask_token_id: int) -> tuple[DiffusionModel, dict]:
    """A Dream-layout DLLM over the weights of `folder`: an autoregressive Llama folder, or a DLLM
    this command saved (training continues)."""
    from safetensors.torch import load_file

    raw = dream_config_from_llama(json.loads((folder / "config.json").read_text()), mask_token_id)
    model = DiffusionModel(diffusion_config(raw))
    state = {}
    for f in sorted(folder.glob("*.safetensors")):
        state.update({k: v.float() for k, v in load_file(str(f)).items()})
    load_state(model, state)
    return model, raw


def samples_text(model: DiffusionModel, tokenizer, prompts: list[list[int]], max_tokens: int, eos: list[int]) -> list[str]:
    """Greedy static decoding (block 32) of each prompt, cut at the first EOS."""
    outputs, _ = decode_greedy(model.eval(), prompts, max_tokens, DecodeOptions(BLOCK), frozenset(eos))
    return [tokenizer.decode(ids, skip_special_tokens=True) for ids in outputs]


def distill_diffusion(args, setup, shards: list[Path], log) -> int:
    from specray.kernels.chat import prompt_token_ids
    from specray.kernels.loader import resolve

    init = resolve(args.init_from or DEFAULT_INIT)
    tok = setup.tokenizer
    mask_id = tok.convert_tokens_to_ids(MASK_TOKEN)
    model, raw = init_dllm(init.path, mask_id)
    if model.config.model.vocab_size != len(tok):
        raise ValueError(f"--init-from {init.name} has a vocabulary of {model.config.model.vocab_size}, the target's "
                         f"tokenizer {len(tok)}: a DLLM trained on the target's text needs its tokenizer")
    gen_length = -(-args.max_tokens // BLOCK) * BLOCK
    eos = setup.eos[0]
    exs = examples(load_samples(shards), gen_length, eos, max_prompt=args.max_len - gen_length)
    num_val = max(1, len(exs) // 20)
    val, train = exs[:num_val], exs[num_val:]
    log(f"specray distill: DLLM from {init.name}: {len(train)} training, {len(val)} held-out responses")
    before = {r: masked_token_loss(model, val, r) for r in (0.25, 0.5, 0.9)}
    cfg = ScheduleConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, max_len=args.max_len,
                         checkpoint_every=args.checkpoint_every, seed=args.seed, max_seconds=args.max_train_seconds)
    order = list(range(len(train)))
    batches = [order[i:i + cfg.batch_size] for i in range(0, len(order), cfg.batch_size)]

    def loss_of(batch: list[int], step: int) -> torch.Tensor:
        return diffusion_loss(model, [train[i] for i in batch], BLOCK, random.Random(args.seed * 1_000_003 + step))

    summary = run_training(model, list(model.parameters()), batches, loss_of, cfg, setup.out / "dllm_checkpoint.pt",
                           desc="distill (diffusion LM)", log=log)
    model.eval()
    after = {r: masked_token_loss(model, val, r) for r in (0.25, 0.5, 0.9)}
    eval_ids = [prompt_token_ids(tok, p) for p in setup.eval_prompts[:6]]
    texts = samples_text(model, tok, eval_ids, args.eval_max_tokens, setup.eos)
    info = {"init": init.name, "mask_token": MASK_TOKEN, "mask_token_id": mask_id, "gen_length": gen_length,
            "train_responses": len(train), "heldout_responses": len(val), **summary,
            "masked_token_loss_before": before, "masked_token_loss_after": after,
            "samples": [{"prompt": p, "response": t} for p, t in zip(setup.eval_prompts, texts)]}
    save_dllm(setup.out / "dllm", model, raw, init.path, info)
    log(f"specray distill: saved {setup.out / 'dllm'}; held-out masked-token loss (ratio 0.5) "
        f"{before[0.5]:.3f} -> {after[0.5]:.3f} nats")
    return 0


def save_dllm(folder: Path, model: DiffusionModel, raw: dict, tokenizer_from: Path, info: dict) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file(dream_state(model), str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(raw, indent=2))
    for name in TOKENIZER_FILES:
        if (tokenizer_from / name).exists():
            shutil.copy(tokenizer_from / name, folder / name)
    (folder / "eval.json").write_text(json.dumps({**info, "saved": time.strftime("%Y-%m-%d")}, indent=2))
