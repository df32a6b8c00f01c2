"""Write the OpenAPI schema of the app: ``python -m service.openapi_export PATH``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from service.app import create_app
from service.config import Settings


def schema() -> dict[str, Any]:
    # Built from a throwaway embedded settings object: the schema must not depend on the
    # environment of whoever exports it.
    return create_app(Settings.model_construct()).openapi()


def render() -> str:
    return json.dumps(schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main() -> None:
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "openapi/openapi.json")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render())
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
