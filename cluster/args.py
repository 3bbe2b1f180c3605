"""argparse value types the CLI commands share."""

from __future__ import annotations


def int_list(text: str) -> list[int]:
    """ "1,4,8" -> [1, 4, 8] """
    return [int(x) for x in text.split(",") if x]


def float_list(text: str) -> list[float]:
    """ "0,1.0" -> [0.0, 1.0] """
    return [float(x) for x in text.split(",") if x]
