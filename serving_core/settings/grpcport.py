"""The rules SERVING_GRPC_PORT sets for the other settings (``Settings.resolved``)."""

from __future__ import annotations


def grpc_fault(grpc_port: int, bind: str) -> str | None:
    """What breaks SERVING_GRPC_PORT's rules with the other settings, or None."""
    host, _, port = bind.rpartition(":")
    if bind.startswith("unix:") or not host:
        return (
            f"SERVING_GRPC_PORT={grpc_port} takes its host from SERVING_BIND, "
            f"which is {bind!r}; bind HOST:PORT (e.g. 0.0.0.0:8000)"
        )
    if port == str(grpc_port):
        return (
            f"SERVING_GRPC_PORT={grpc_port} is SERVING_BIND's port too; gunicorn "
            "speaks HTTP/1.1 there: give gRPC a port of its own (e.g. 8001)"
        )
    return None
