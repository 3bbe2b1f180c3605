"""argparse value types the CLI commands share."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def int_list(text: str) -> list[int]:
    """ "1,4,8" -> [1, 4, 8] """
    return [int(x) for x in text.split(",") if x]


def positive_ints_or_none(text: str) -> list[int]:
    """ "2,4" -> [2, 4], each >= 1; "" -> [] (an optional extra: none) """
    return [positive_int(x) for x in text.split(",") if x.strip()]


def float_list(text: str) -> list[float]:
    """ "0,1.0" -> [0.0, 1.0] """
    return [float(x) for x in text.split(",") if x]


def non_negative_int_list(text: str) -> list[int]:
    """ "0,2,3" -> [0, 2, 3], each >= 0, at least one """
    return _checked_list(text, non_negative_int, "integers >= 0")


def _number(text: str, convert, low, what: str):
    try:
        value = convert(text)
    except ValueError:
        value = None
    if value is None or value < low or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (a count: requests, prompts, tokens, threads)."""
    return _number(text, int, 1, "an integer >= 1")


def non_negative_int(text: str) -> int:
    """An integer >= 0 (a count where 0 turns the thing off)."""
    return _number(text, int, 0, "an integer >= 0")


def _checked_list(text: str, one, what: str) -> list:
    values = [one(x) for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}")
    return values


def positive_int_list(text: str) -> list[int]:
    """ "1,4,8" -> [1, 4, 8], each >= 1, at least one (batch sizes, concurrency levels, drafts) """
    return _checked_list(text, positive_int, "integers >= 1")


def non_negative_float(text: str) -> float:
    """A number >= 0 (a temperature)."""
    return _number(text, float, 0.0, "a number >= 0")


def positive_float(text: str) -> float:
    """A number > 0 (a request rate)."""
    value = _number(text, float, 0.0, "a number > 0")
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def non_negative_float_list(text: str) -> list[float]:
    """ "0,1.0" -> [0.0, 1.0], each >= 0, at least one (temperatures) """
    return _checked_list(text, non_negative_float, "numbers >= 0")


def out_folder(text: str) -> str:
    """A folder for a command's outputs: absent (it is made) or a folder, refused before any work."""
    if not text or (Path(text).exists() and not Path(text).is_dir()):
        raise argparse.ArgumentTypeError(f"expected a folder for the outputs, got {text!r}"
                                         + (" (a file)" if text else ""))
    return text


def name_list(text: str) -> str:
    """ "a,b" -> "a,b" with at least one name (methods, paths): an empty list is a mistake, not "all" """
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return ",".join(names)


def json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def int_or_auto(text: str) -> int | str:
    """ "auto" or an integer (the config then checks its range) """
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from None
