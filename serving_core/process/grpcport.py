"""The master's hold on SERVING_GRPC_PORT (findings L4 and F2).

Every worker's gRPC server binds the port with SO_REUSEPORT, so that the
kernel spreads connections over them. That option also lets a second server
of the same user bind the same port without an error, and then take a share
of the connections meant for the first. So the master first binds the port
without SO_REUSEPORT, which fails while anything else holds it (another
server's workers included), and stops with a message naming the port; then it
keeps a socket bound with SO_REUSEPORT, never listening (so it takes no
connection), for as long as it runs: another server started later fails its
own first bind the same way.
"""

from __future__ import annotations

import socket

from serving_core.settings import Settings, SettingsError


def hold(settings: Settings) -> socket.socket | None:
    """The master's socket on the gRPC port; None when gRPC is off. Raises
    ``SettingsError`` when the port is taken."""
    if not settings.grpc_port:
        return None
    host = settings.bind.rpartition(":")[0].strip("[]")
    family, kind, proto, _, address = socket.getaddrinfo(
        host or None, settings.grpc_port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    try:
        with socket.socket(family, kind, proto) as alone:
            alone.bind(address)
    except OSError as exc:
        raise SettingsError(
            f"SERVING_GRPC_PORT={settings.grpc_port}: {host or '*'}:{settings.grpc_port} is in "
            f"use ({exc.strerror}); stop what holds it (another serving-core?) or set "
            "SERVING_GRPC_PORT to a free port"
        ) from None
    held = socket.socket(family, kind, proto)
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    held.bind(address)
    return held
