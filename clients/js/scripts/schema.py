"""Writes clients/js/openapi.json: the OpenAPI schema the app serves at /api/schema/ (as the
standalone site mounts it), from which `npm run build` generates the package's types. Run it
(`npm run schema`, or `python clients/js/scripts/schema.py` from the repository's root) after a
change to the API; tests/client/test_js_schema.py fails until the file is the served schema again."""

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TARGET = ROOT / "clients" / "js" / "openapi.json"


def served_schema() -> str:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.test import Client

    response = Client(HTTP_HOST="localhost").get("/api/schema/", {"format": "json"})
    if response.status_code != 200:
        raise SystemExit(f"/api/schema/ answered {response.status_code}")
    return json.dumps(json.loads(response.content), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    TARGET.write_text(served_schema(), encoding="utf-8")
    print(f"wrote {TARGET.relative_to(ROOT)}")
