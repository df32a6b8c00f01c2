"""JSON request bodies read strictly.

- An object that names a key twice is refused (422), where ``json.loads`` would keep the last
  value silently. Applies to every JSON body (``install``) and to the metadata of uploads
  (``loads``).
- Every JSON request body model (and the upload's ``metadata``) derives from ``StrictBody``:
  a number field takes a JSON number only (an integer where a float is asked for), never a
  bool or a string (lax pydantic read ``"epsilon": true`` as 1 and ``"1"`` as 1.0); a bool
  field takes ``true``/``false`` only; a string field a string. The schema already says so.
  Mechanism parameters (``dpcore`` models, lax for the values the service stored itself) are
  checked alike at the API by ``service.releases.mechanisms.strict_params``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from pydantic import BaseModel, BeforeValidator, ConfigDict, Strict

from service.errors import InvalidInput


class StrictBody(BaseModel):
    """The base of every JSON request body: unknown keys refused, JSON types taken as the
    schema gives them (see the module's docstring)."""

    model_config = ConfigDict(extra="forbid", strict=True)


# FastAPI validates a body in pydantic's Python mode, where strictness also refuses a string
# for an enum (it wants the enum's instance) and an array for a tuple (it wants a tuple): the
# JSON forms the schema documents. Annotate such a field ``Annotated[Role, FROM_JSON]`` (or a
# tuple ``Annotated[tuple[float, float], FROM_JSON]``): that one conversion is lax (an enum
# still takes only its values; a tuple still no string), its items stay strict.
FROM_JSON = Strict(False)


def _json_number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a JSON number (an integer), not a string or a bool")
    return value


# An integer field: a JSON number with no fraction. Strict ints refuse 60.0, which JSON Schema
# (and so the schema's "type": "integer") counts as an integer, as mechanism parameters do:
# the number is read laxly (60.0 is 60, 60.5 is refused), after refusing a bool or a string.
# Bounds go before these two (``Annotated[int, Field(ge=1), FROM_JSON, JSON_NUMBER]``), or the
# schema loses its minimum and maximum.
JSON_NUMBER = BeforeValidator(_json_number)
JsonInt = Annotated[int, FROM_JSON, JSON_NUMBER]


class DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(f"the key {key!r} appears more than once in one JSON object")
        self.key = key


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


class NulCharacter(ValueError):
    """Text holding U+0000, which Postgres cannot store in a text column: refused (422)
    wherever it arrives, rather than failing later in the database (a 500)."""

    def __init__(self, where: str) -> None:
        super().__init__(f"{where} holds a NUL character (U+0000), which the service refuses")
        self.where = where


def has_nul(value: Any) -> bool:
    """Whether a decoded JSON value holds U+0000 in any string or key."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(has_nul(k) or has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(has_nul(v) for v in value)
    return False


#: The deepest nesting of arrays and objects a JSON text may have.
MAX_DEPTH = 64


class TooDeep(ValueError):
    def __init__(self) -> None:
        super().__init__(f"the JSON nests arrays and objects more than {MAX_DEPTH} deep")


def depth(text: str | bytes) -> int:
    """The deepest nesting of ``[`` and ``{`` in a JSON text, outside strings: counted before
    parsing, so a deep text costs one pass, never the parser's recursion."""
    raw = text.encode() if isinstance(text, str) else text
    deepest = level = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            level += 1
            deepest = max(deepest, level)
        elif byte in (0x5D, 0x7D):
            level -= 1
    return deepest


def loads(text: str | bytes) -> Any:
    """``json.loads``, raising ``DuplicateKey`` for a key given twice in one object,
    ``NulCharacter`` for a U+0000 in any string or key and ``TooDeep`` past ``MAX_DEPTH``."""
    if depth(text) > MAX_DEPTH:
        raise TooDeep()
    value = json.loads(text, object_pairs_hook=_unique)
    if has_nul(value):
        raise NulCharacter("the JSON")
    return value


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


async def unique_keys(request: Request) -> None:
    """Refuse a path or query holding U+0000, and a JSON body with a duplicate key or a
    U+0000. FastAPI has read and decoded the body before dependencies run (an undecodable one
    is already a 422); the bytes are cached, so this only parses them again."""
    if "\x00" in request.url.path or "\x00" in request.scope.get("path", ""):
        raise InvalidInput(str(NulCharacter("the request's path")))
    if any("\x00" in k or "\x00" in v for k, v in request.query_params.multi_items()):
        raise InvalidInput(str(NulCharacter("the request's query")))
    if not _is_json(request.headers.get("content-type", "")):
        return
    body = await request.body()
    if not body:
        return
    try:
        loads(body)
    except DuplicateKey as exc:
        raise InvalidInput(
            f"request body: {exc}: give each key once", detail={"key": exc.key}
        ) from exc
    except NulCharacter:
        raise InvalidInput(str(NulCharacter("the request body"))) from None
    except TooDeep as exc:
        raise InvalidInput(f"request body: {exc}") from None
    except ValueError:
        return  # not JSON: FastAPI answers that


def install(app: FastAPI) -> None:
    """Every operation added to ``app`` from now on (routers included after this call) runs
    ``unique_keys``: call it before ``include_router``."""
    app.router.dependencies.append(Depends(unique_keys))
