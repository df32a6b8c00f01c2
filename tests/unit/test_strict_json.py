"""JSON read strictly: nesting counted outside strings before parsing; NUL characters found
in keys and values."""

from __future__ import annotations

import pytest

from service import strict_json


def test_depth_counts_brackets_outside_strings_only() -> None:
    assert strict_json.depth('{"a": [1, {"b": []}]}') == 4
    assert strict_json.depth('{"a": "[[[[{{{{", "b": "\\"[["}') == 1
    assert strict_json.depth(b"[]") == 1 and strict_json.depth("1") == 0
    deep = "[" * (strict_json.MAX_DEPTH + 1) + "]" * (strict_json.MAX_DEPTH + 1)
    with pytest.raises(strict_json.TooDeep):
        strict_json.loads(deep)
    shallow = "[" * strict_json.MAX_DEPTH + "]" * strict_json.MAX_DEPTH
    assert strict_json.loads(shallow) is not None


def test_nul_characters_are_found_in_keys_and_nested_values() -> None:
    assert strict_json.has_nul({"a": ["b", {"c\x00": 1}]})
    assert strict_json.has_nul(["ok", ["x\x00"]])
    assert not strict_json.has_nul({"a": ["b", 1, None, {"c": 2.5}]})
    with pytest.raises(strict_json.NulCharacter):
        strict_json.loads('{"name": "a\\u0000b"}')
