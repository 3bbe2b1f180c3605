"""specray: lossless speculative decoding served on Ray.

The offline API is shaped like vLLM's: ``LLM``, ``SamplingParams``, ``RequestOutput``.
"""

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob"]


def __getattr__(name: str):
    # Lazy so that `import specray.protos` (the client SDK) never pulls torch.
    if name in __all__:
        from specray.cluster import llm

        return getattr(llm, name)
    raise AttributeError(f"module 'specray' has no attribute {name!r}")
