"""vLLM's bad_words as token id sequences: each word as it begins a text and as it follows a space.

A one-token sequence is never drawn; a longer one's last token is not drawn right after its others
(kernels/penalties.py `apply_bad_words`).
"""

from __future__ import annotations


def bad_words_token_ids(tokenizer, bad_words: list[str] | None) -> tuple[tuple[int, ...], ...]:
    """The token sequences of `bad_words` (vLLM's rule: the spaced form only where it is other tokens
    of the same count, so a word is banned at the start of a text and in its middle)."""
    out: list[tuple[int, ...]] = []
    for word in bad_words or []:
        bare = tuple(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        spaced = tuple(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        out.append(bare)
        if spaced and bare and spaced[0] != bare[0] and len(spaced) == len(bare):
            out.append(spaced)
    return tuple(dict.fromkeys(s for s in out if s))
