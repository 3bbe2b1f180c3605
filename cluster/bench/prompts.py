"""Benchmark prompts: Spec-Bench first turns (or any JSONL of prompts), a fixed documented subset."""

from __future__ import annotations

import json
from pathlib import Path

PACKAGED_PROMPTS = Path(__file__).parent / "data" / "spec_bench_subset.jsonl"
LONG_CONTEXT = Path(__file__).parent / "data" / "long_context.jsonl"  # 2k-8k tokens (scripts/make_long_context.py)
# the shared folder beside the repository (a source checkout; absent from an installed package)
SHARED_PROMPTS = Path(__file__).resolve().parents[3] / "shared" / "data" / "spec_bench" / "question.jsonl"


def dataset_name(path: str | Path | None) -> str:
    """What a report names as its prompts: the file, or the packaged subset (the default where no
    Spec-Bench lies beside the checkout, so two installs can measure different prompts)."""
    return str(path) if path else f"the packaged Spec-Bench subset ({PACKAGED_PROMPTS.name})"


def prompt_text(row: dict, where: str) -> str:
    """A row's prompt: its "prompt", else the first of its "turns" (Spec-Bench's); ValueError naming `where`."""
    text = row.get("prompt")
    if text is None and isinstance(row.get("turns"), list) and row["turns"]:
        text = row["turns"][0]
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{where}: needs a non-empty string 'prompt', or 'turns' whose first entry is one")
    return text


def read_lines(path: Path) -> list[tuple[int, str]]:
    """A prompt file's non-blank lines with their numbers; ValueError where there is no file or none."""
    if not path.exists():
        raise ValueError(f"prompt file {path} does not exist")
    if not path.is_file():
        raise ValueError(f"prompt file {path} is not a file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"prompt file {path} is not UTF-8 text (byte {e.start})") from None
    except OSError as e:  # unreadable (permissions, an I/O error): a line, not a traceback
        raise ValueError(f"prompt file {path} cannot be read: {e.strerror or e}") from None
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise ValueError(f"prompt file {path} holds no prompts")
    return lines


def read_rows(path: Path) -> list[dict]:
    """The rows of a JSONL prompt file (blank lines skipped), each with its "prompt" filled in from
    `prompt_text`; a bad line is a ValueError naming the file and line."""
    rows = []
    for n, line in read_lines(path):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} line {n}: not JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path} line {n}: a JSON object is needed, got {type(row).__name__}")
        rows.append({**row, "prompt": prompt_text(row, f"{path} line {n}")})
    return rows


def load_prompts(path: Path | None, num: int) -> list[dict]:
    """First turns taken round-robin across categories in file order: the first prompt of every
    category, then the second of every category, and so on, until `num`."""
    rows = read_rows(path or PACKAGED_PROMPTS)
    by_cat: dict[str, list[dict]] = {}
    for r in rows:
        by_cat.setdefault(r.get("category", "all"), []).append(r)
    picked, i = [], 0
    while len(picked) < min(num, len(rows)):
        for cat_rows in by_cat.values():
            if i < len(cat_rows) and len(picked) < num:
                row = cat_rows[i]
                picked.append({"category": row.get("category", "all"), "prompt": row["prompt"],
                               **({"context_tokens": row["context_tokens"]} if "context_tokens" in row else {})})
        i += 1
    return picked
