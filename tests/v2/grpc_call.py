"""A gRPC call's context as ``grpc.servicer`` uses it, for tests that call the servicer
directly: its peer, no deadline, ``key`` (if any) in its metadata, and an abort that
fails the test."""

from __future__ import annotations

from typing import Any


class Call:
    def __init__(self, key: str | None = None) -> None:
        self.key = key

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {self.key}")] if self.key else []

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5000"

    def time_remaining(self) -> float | None:
        return None

    def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"aborted: {code} {details}")
