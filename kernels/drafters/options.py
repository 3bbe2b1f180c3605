"""What a drafter is built from: the `speculative_config` keys a draft worker needs, under the
same names, plus where it runs. Validated by the registry (`registry.check_options`)."""

from __future__ import annotations

from dataclasses import dataclass


# the blocks a draft's weights are rounded to ("none": kept as loaded); lossless whichever
DRAFT_QUANTIZATIONS = ("q8_0", "q4_1", "none")


@dataclass(frozen=True)
class DraftOptions:
    method: str  # a name in registry.METHODS
    model: str | None = None  # draft checkpoint or folder; aded: the target (its tokenizer)
    draft_num_layers: int | None = None  # keep only the draft's first layers
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    dtype: str = "float32"
    device: str = "cpu"
    num_blocks: int = 1024  # draft KV blocks
    block_size: int = 16  # tokens per draft KV block
    tree: dict | None = None  # speculative_config['tree']
    aded: dict | None = None  # speculative_config['aded']
    longspec: dict | None = None  # speculative_config['longspec']
    draft_vocab_trim: int | None = None  # VocabTrim size: None = the draft folder's default, 0 = off
    draft_quantization: str | None = None  # one of DRAFT_QUANTIZATIONS; None = q8_0 on CPU in fp32
    lookup_first: bool | dict | None = None  # speculative_config['lookup_first']
    layer_parallel: int | None = None  # speculative_config['layer_parallel']: EasySpec group size

    def __post_init__(self) -> None:
        assert self.num_blocks >= 1 and self.block_size >= 1
        assert self.prompt_lookup_min >= 1
