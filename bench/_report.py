"""Writing a benchmark's report: the Markdown it printed and its figures as JSON beside it."""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["write_report"]


def write_report(out: Path, title: str, markdown: str, data: dict[str, Any]) -> None:
    """Print ``markdown``; write it to ``out`` under ``# {title}, {today}`` and ``data`` as
    JSON beside it (``.json``); say where on stderr."""
    print(markdown)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"# {title}, {dt.date.today().isoformat()}\n\n{markdown}")
    out.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {out}", file=sys.stderr)
