"""The async network client: Producer, Consumer and StreamReader over a seglog node's HTTP API."""

from __future__ import annotations

from seglog.client.consumer import Consumer
from seglog.client.producer import Producer
from seglog.client.streams import StreamReader

__all__: list[str] = ["Consumer", "Producer", "StreamReader"]
