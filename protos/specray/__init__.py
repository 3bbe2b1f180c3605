"""Namespace of the `specray.*` proto packages (generated stubs)."""
