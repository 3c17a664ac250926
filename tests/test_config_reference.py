"""config/REFERENCE.md is what the schema says: every key, its type, default and meaning."""

from __future__ import annotations

from sip_bridge.config import config_reference as ref
from sip_bridge.config.loader import _SCHEMA
from sip_bridge.config.routes import ROUTE_KEYS
from sip_bridge.config.trunks import TRUNK_KEYS


def test_the_reference_file_is_what_the_schema_generates() -> None:
    # after adding a key:
    # .venv/bin/python -m sip_bridge.config.config_reference > config/REFERENCE.md
    assert ref.REFERENCE.read_text() == ref.render()


def test_every_key_has_a_meaning_and_no_meaning_is_stale() -> None:
    keys = {f"{s}.{k}" for s, ks in _SCHEMA.items() for k in ks}
    keys |= {f"trunks.{k}" for k in TRUNK_KEYS} | {f"routes.{k}" for k in ROUTE_KEYS}
    assert set(ref.MEANINGS) == keys
    text = ref.render()
    for key in keys:
        section, _, name = key.rpartition(".")
        assert f"| `{name}` |" in text.split(f"## `[{section}]`")[-1].split("## ")[0] or (
            f"| `{name}` |" in text.split(f"## `[[{section}]]`")[-1].split("## ")[0]
        ), key
