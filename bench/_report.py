"""Writing a benchmark's report: the Markdown it printed and its figures as JSON beside it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["write_report"]


def write_report(out: Path, markdown: str, data: dict[str, Any]) -> None:
    """Write ``out`` (Markdown) and ``out`` with a ``.json`` suffix; say where on stderr."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown)
    out.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {out}", file=sys.stderr)
