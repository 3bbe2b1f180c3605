"""Integer helpers shared by every layer."""


def ceil_div(a: int, b: int) -> int:
    """ceil(a / b) for integers, b > 0 (e.g. KV blocks that hold a number of tokens)."""
    assert b > 0
    return -(-a // b)
