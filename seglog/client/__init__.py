"""The async network client: Producer and Consumer over a seglog node's HTTP API."""

from __future__ import annotations

from seglog.client.consumer import Consumer
from seglog.client.producer import Producer

__all__: list[str] = ["Consumer", "Producer"]
