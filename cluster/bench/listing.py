"""Finding a server from `--url`: its root with or without `/v1`, and the models it lists
(OpenAI's `/v1/models` or llama-server's), with clear errors where it lists none."""

from __future__ import annotations


def api_root(url: str) -> str:
    """The server's root from `--url`: `http://h:p`, `http://h:p/` and `http://h:p/v1` all name it."""
    root = url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def model_ids(listing) -> list[str]:
    """Model ids from a `/v1/models` body: OpenAI's `data` list, or llama-server's `models` list."""
    if not isinstance(listing, dict):
        raise ValueError(f"expected a JSON object, got {type(listing).__name__}")
    entries = listing.get("data") or listing.get("models") or []
    ids = [e.get("id") or e.get("model") or e.get("name") for e in entries if isinstance(e, dict)]
    return [i for i in ids if isinstance(i, str) and i]


def first_model(httpx, url: str, headers: dict) -> str:
    """The first model the server lists; a clear error (status, body) where it lists none."""
    models_url = api_root(url) + "/v1/models"
    try:
        response = httpx.get(models_url, headers=headers, timeout=30)
    except httpx.HTTPError as e:
        raise ValueError(f"cannot list models at {models_url}: {e}") from None
    if response.status_code != 200:
        raise ValueError(f"cannot list models at {models_url}: HTTP {response.status_code}: "
                         f"{response.text[:200]!r}; pass --model to skip the listing")
    try:
        ids = model_ids(response.json())
    except ValueError as e:
        raise ValueError(f"cannot list models at {models_url}: not a model listing ({e})") from None
    if not ids:
        raise ValueError(f"{models_url} lists no models: {response.text[:200]!r}; pass --model")
    return ids[0]


def first_grpc_model(target: str, api_key: str | None) -> str:
    """The first model a specray gRPC server lists (ListModels), with a clear error where it cannot."""
    from specray.client import Client
    from specray.client.errors import SpecrayError

    try:
        with Client(target, api_key=api_key, timeout=30) as client:
            models = client.models()
    except SpecrayError as e:
        raise ValueError(f"cannot list models over gRPC at {target}: {e}") from None
    if not models:
        raise ValueError(f"the gRPC server at {target} lists no models; pass --model")
    return models[0].id
