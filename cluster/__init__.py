"""specray's cluster side: the public offline API at this root (`LLM`, `SamplingParams`, outputs, the
`specray` CLI in cli.py), and one subpackage per job: router/, pools/, serve/, config/, bench/, distill/."""

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob"]


def __getattr__(name: str):
    # Lazy, as `specray` itself: importing a subpackage (the CLI's parser, say) never loads torch.
    if name in __all__:
        from specray.cluster import llm

        return getattr(llm, name)
    raise AttributeError(f"module 'specray.cluster' has no attribute {name!r}")
