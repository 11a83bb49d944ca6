"""SERVING_GRPC_PORT's rules: the gRPC front runs beside either worker class, on
SERVING_BIND's host and a port of its own; each refusal says what to set."""

from __future__ import annotations

import pytest

from serving_core.settings import Settings, SettingsError


def test_grpc_port_takes_the_bind_host_and_is_off_by_default() -> None:
    assert Settings.from_env({}, cores=1).grpc_port == 0
    for worker_class in ("gevent", "gthread"):
        env = {"SERVING_GRPC_PORT": "8001", "SERVING_WORKER_CLASS": worker_class}
        assert Settings.from_env(env, cores=1).grpc_port == 8001
    # The default worker class takes it too (it was refused before issue 42).
    assert Settings.from_env({"SERVING_GRPC_PORT": "8001"}, cores=1).grpc_port == 8001


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"SERVING_BIND": "unix:/tmp/app.sock"}, "bind HOST:PORT"),
        ({"SERVING_BIND": "127.0.0.1:8001"}, "give gRPC a port of its own"),
    ],
)
def test_a_grpc_port_that_cannot_work_is_refused(env: dict[str, str], says: str) -> None:
    environ = {"SERVING_GRPC_PORT": "8001", **env}
    with pytest.raises(SettingsError, match=says):
        Settings.from_env(environ, cores=1)
