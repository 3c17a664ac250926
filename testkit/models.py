"""Model files for tests, from the model store (`make test` fetches them first)."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_runtime.store import ModelError, default_store


def model_file(model: str, name: str) -> Path:
    """The stored file, verified; a missing or corrupt model fails the test (never skips)."""
    try:
        return default_store().path(model, name)
    except ModelError as exc:
        pytest.fail(str(exc))
