"""Old import path of the Serve application, kept for deployed RayServices (`specray.cluster.serve_app:build_app`)."""
from specray.cluster.serve.app import SpecrayServer, build_app  # noqa: F401
