"""SERVING_PAYLOAD_LOG_URL, checked at start-up by the sink its scheme picks: a bad one
names the variable and how to fix it, and never shows a password."""

from __future__ import annotations

import subprocess

import pytest

from serving_core.payloads import sinks
from serving_core.settings import Settings, SettingsError
from serving_core.stream.brokers import BROKERS
from tests.conftest import PROBE
from tests.servers import ROOT, SERVING_CORE, base_env


@pytest.mark.parametrize(
    "url",
    [
        "",
        "http://collector:8080/events",
        "https://user:pass@collector.example.com/events",
        "redis://127.0.0.1:6379/0?stream=payloads",
        "amqp://guest:guest@127.0.0.1:5672/%2F?exchange=payloads&routing_key=payloads",
        "kafka://127.0.0.1:9092/payloads",
    ],
)
def test_a_good_url_passes(url):
    sinks.check(url)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ftp://:hunter2@host/x", "names no payload sink"),
        ("http:///events", "names no host"),
        ("redis://:hunter2@127.0.0.1:6379/0", "names no stream"),
        ("amqp://guest:hunter2@127.0.0.1:5672/%2F", "routing_key"),
    ],
)
def test_a_bad_url_names_the_variable_and_hides_the_password(url, says):
    with pytest.raises(ValueError, match=says) as refused:
        sinks.check(url)
    message = str(refused.value)
    assert message.startswith("SERVING_PAYLOAD_LOG_URL=")
    assert "hunter2" not in message


def test_every_broker_of_the_stream_worker_is_a_sink():
    assert set(BROKERS) | {"http", "https"} == set(sinks.SINKS)


def test_the_settings_read_the_payload_log():
    settings = Settings.from_env(
        {
            "SERVING_PAYLOAD_LOG_URL": "http://collector/events",
            "SERVING_PAYLOAD_LOG_RATE": "0.05",
            "SERVING_PAYLOAD_LOG_ERRORS": "false",
            "SERVING_PAYLOAD_LOG_REDACT": " email, ssn ,,",
            "SERVING_PAYLOAD_LOG_QUEUE": "50",
        },
        cores=1,
    )
    assert settings.payload_log_rate == 0.05
    assert settings.payload_log_errors is False
    assert settings.payload_log_redact == ("email", "ssn")
    assert settings.payload_log_queue == 50
    defaults = Settings.from_env({}, cores=1)
    assert (defaults.payload_log_url, defaults.payload_log_rate) == ("", 1.0)
    assert (defaults.payload_log_errors, defaults.payload_log_queue) == (True, 1000)


@pytest.mark.parametrize(
    ("name", "value"),
    [("RATE", "1.5"), ("RATE", "-0.1"), ("QUEUE", "0"), ("URL", "collector:8080")],
)
def test_a_bad_value_names_its_variable(name, value):
    with pytest.raises(SettingsError, match=f"SERVING_PAYLOAD_LOG_{name}"):
        Settings.from_env({f"SERVING_PAYLOAD_LOG_{name}": value}, cores=1)


def test_serve_stops_at_start_up_on_a_bad_url_naming_the_variable():
    env = base_env(
        {
            "SERVING_HANDLER": PROBE,
            "SERVING_PAYLOAD_LOG_URL": "redis://:hunter2@127.0.0.1:6379/0",
        }
    )
    done = subprocess.run(
        [str(SERVING_CORE), "serve"],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    said = done.stdout + done.stderr
    assert done.returncode != 0
    assert "SERVING_PAYLOAD_LOG_URL=" in said
    assert "names no stream" in said
    assert "hunter2" not in said
