"""Write the definitions of fedaudit/run/metrics.schema.json that are generated from metrics.json's typed models
(:data:`fedaudit.run.stored.SCHEMA_DEFS`); the file's other definitions are kept by hand until their block has a model
(issue 59 moves them one family at a time).

    python scripts/metrics_schema.py            # rewrite those definitions in the file
    python scripts/metrics_schema.py --check    # exit 1 if the file differs from the models (tests/test_results.py)
"""

from __future__ import annotations

import argparse
import json
import sys

from fedaudit.run.results import SCHEMA_FILE
from fedaudit.run.stored import schema_defs


def generated_text() -> str:
    """The schema file's text with every generated definition as the models give it (in place; new ones last)."""
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    schema["$defs"].update(schema_defs())
    return json.dumps(schema, indent=1, ensure_ascii=False) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is behind the models")
    args = parser.parse_args()
    text = generated_text()
    if args.check:
        behind = json.loads(SCHEMA_FILE.read_text(encoding="utf-8")) != json.loads(text)
        print(f"{SCHEMA_FILE} is {'behind the models: run python scripts/metrics_schema.py' if behind else 'current'}")
        return int(behind)
    SCHEMA_FILE.write_text(text, encoding="utf-8")
    print(f"wrote {SCHEMA_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
