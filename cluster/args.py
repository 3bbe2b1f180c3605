"""argparse value types the CLI commands share."""

from __future__ import annotations

import argparse
import json


def int_list(text: str) -> list[int]:
    """ "1,4,8" -> [1, 4, 8] """
    return [int(x) for x in text.split(",") if x]


def float_list(text: str) -> list[float]:
    """ "0,1.0" -> [0.0, 1.0] """
    return [float(x) for x in text.split(",") if x]


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
