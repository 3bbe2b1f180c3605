"""Generated stubs of the `specray.v1` proto package (see protos/README.md)."""
