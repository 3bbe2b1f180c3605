"""Flags of a tiny `specray distill` run (seconds on a 2-core CPU)."""

ARGS = ["--num-prompts", "24", "--max-tokens", "12", "--teacher-top-k", "8", "--gen-batch-size", "8",
        "--hidden-size", "32", "--num-layers", "2", "--intermediate-size", "64", "--epochs", "4", "--batch-size", "4",
        "--lr", "3e-3", "--vocab-trim-k", "40", "--eval-prompts", "3", "--eval-max-tokens", "10", "--eval-k", "2",
        "--device", "cpu", "--checkpoint-every", "5"]
