"""The async network client: Producer and Consumer over a seglog node's HTTP API."""

from __future__ import annotations

__all__: list[str] = []
