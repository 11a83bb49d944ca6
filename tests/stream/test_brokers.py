"""``stream.brokers``: each end's broker, picked by its URL's scheme, checks the URL at
start-up before a model loads, and the error names the variable and what to fix."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from serving_core.stream import brokers
from serving_core.stream.brokers import BROKERS, Broker
from tests.servers import SERVING_CORE, base_env

AMQP = "amqp://u:hunter2@rabbit:5672/%2F"
REDIS = "redis://:hunter2@redis:6379/0"
GOOD = (f"{AMQP}?queue=in", f"{AMQP}?exchange=&routing_key=out", f"{REDIS}?stream=dead")


def ends(**changed: str) -> tuple[str, str, str]:
    source, sink, dead = GOOD
    return changed.get("source", source), changed.get("sink", sink), changed.get("dead", dead)


@pytest.mark.parametrize(
    ("changed", "said"),
    [
        ({"source": ""}, "SERVING_STREAM_SOURCE is not set"),
        ({"sink": ""}, "SERVING_STREAM_SINK is not set"),
        ({"dead": ""}, "SERVING_STREAM_DEAD_LETTER is not set"),
        (
            {"source": f"{AMQP}"},
            "SERVING_STREAM_SOURCE='amqp://u:***@rabbit:5672/%2F': an AMQP source needs queue=NAME",
        ),
        ({"source": f"{AMQP}?queue="}, "an AMQP source needs queue=NAME"),
        ({"source": f"{AMQP}?queue=a&queue=b"}, "queue= is given twice"),
        ({"source": "amqp:///%2F?queue=q"}, "an AMQP source is amqp://USER:PASS@HOST:PORT"),
        ({"source": "amqp://h:99999/%2F?queue=q"}, "SERVING_STREAM_SOURCE='amqp://h:99999"),
        ({"source": f"{AMQP}?queue=q&heartbeat=soon"}, "Invalid heartbeat value"),
        ({"sink": f"{AMQP}?exchange=x"}, "SERVING_STREAM_SINK="),
        ({"sink": f"{AMQP}?exchange=x"}, "an AMQP sink needs routing_key=NAME"),
        ({"dead": f"{AMQP}?queue=q&routing_key=r"}, "Unknown URL parameter: 'queue'"),
        (
            {"source": "redis://redis:6379/0"},
            "SERVING_STREAM_SOURCE='redis://redis:6379/0' names no stream; add ?stream=NAME",
        ),
        ({"dead": f"{REDIS}?stream="}, "SERVING_STREAM_DEAD_LETTER="),
        ({"dead": f"{REDIS}?stream="}, "names no stream; add ?stream=NAME"),
        ({"source": "redis://redis:port/0?stream=s"}, "has a port that is not 0..65535"),
        ({"source": "unix://?stream=s"}, "names no socket path"),
        ({"sink": "redis://r/0?stream=s&maxlen=many"}, "maxlen='many' is not a whole number"),
        ({"source": "redis://r/0?stream=s&claim_idle_ms=1m"}, "claim_idle_ms='1m' is not"),
        (
            {"sink": "nats://k:4222/t"},
            "SERVING_STREAM_SINK='nats://k:4222/t': nats:// names "
            "no broker serving-core streams with; use a URL of one of amqp://, amqps://, "
            "redis://, rediss://, unix://, kafka://, kafkas://",
        ),
        (
            {"source": "kafka://k/t"},
            "SERVING_STREAM_SOURCE='kafka://k/t' names no brokers as HOST:PORT[,HOST:PORT...]",
        ),
        ({"source": "kafka://k:9092/"}, "'' is not a topic name"),
        ({"source": "kafka://k:9092/a b"}, "'a b' is not a topic name"),
        ({"source": "kafka://k:9092/t?group="}, "group= is empty"),
        ({"source": "kafka://k:9092/t?group=a&group=b"}, "group= is given twice"),
        ({"sink": "kafka://k:9092/t?group.id=g"}, "group.id= is set by group=; leave it out"),
        ({"sink": "kafka://k:9092/t?enable.auto.commit=true"}, "enable.auto.commit= is set by"),
        ({"sink": "kafka://k:9092/t?Linger=5"}, "'Linger' is not a librdkafka property"),
        (
            {"dead": "kafka://u:hunter2@k:9092/t?lingerr.ms=5"},
            "SERVING_STREAM_DEAD_LETTER='kafka://u:***@k:9092/t?lingerr.ms=5': librdkafka "
            'refuses the URL\'s properties (No such configuration property: "lingerr.ms")',
        ),
        (
            {"source": "kafka://k:9092/t?sasl.password=hunter2&session.timeout.ms=soon"},
            'Invalid value for configuration property "session.timeout.ms"',
        ),
        ({"source": "kafka://:hunter2@k:9092/t"}, "the user info is USER:PASS@ (SASL)"),
        ({"source": "redis:/r?stream=s"}, "no scheme names no broker"),
    ],
)
def test_a_bad_end_is_refused_by_its_broker_naming_the_variable(
    changed: dict[str, str], said: str
) -> None:
    with pytest.raises(ValueError, match=r"^SERVING_STREAM_") as info:
        brokers.check(*ends(**changed))
    assert said in str(info.value)
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        "amqps://u:p@h:5671/v?exchange=&routing_key=q&heartbeat=30",
        "redis://h/0?stream=s&maxlen=100",
        "rediss://[::1]:6380/1?stream=s&group=g&claim_idle_ms=5000",
        "unix:///run/redis.sock?stream=s",
        "kafka://k1:9092,k2:9092/t.1?group=g&session.timeout.ms=10000&linger.ms=5",
        "kafkas://u:p%40ss@k:9093/t?sasl.mechanism=SCRAM-SHA-512",
    ],
)
def test_the_urls_the_brokers_take_are_taken(url: str) -> None:
    brokers.check(url.replace("exchange=&routing_key=q", "queue=q"), url, url)


@pytest.mark.parametrize("module", sorted(set(BROKERS.values())))
def test_each_broker_module_has_the_brokers_functions(module: str) -> None:
    broker = importlib.import_module(module)
    for name in ("check_source", "check_sink", "open_source", "open_sink"):
        wanted = inspect.signature(getattr(Broker, name))
        found = inspect.signature(getattr(broker, name))
        assert list(found.parameters) == list(wanted.parameters)[1:], (module, name)


def test_a_redis_user_never_imports_pika_nor_confluent_kafka() -> None:
    code = (
        "import sys\n"
        "from serving_core.stream import brokers\n"
        f"brokers.check('{REDIS}?stream=a', '{REDIS}?stream=b', '{REDIS}?stream=c')\n"
        "brokers.open_sink('redis://127.0.0.1:1/0?stream=b').close()\n"
        "assert 'pika' not in sys.modules, 'pika was imported'\n"
        "assert 'confluent_kafka' not in sys.modules, 'confluent_kafka was imported'\n"
    )
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root, timeout=60)


def test_the_stream_command_refuses_a_bad_end_before_the_handler_loads(tmp_path: Path) -> None:
    handler = tmp_path / "handler.py"
    handler.write_text("raise SystemExit('the handler was imported')\n")
    source, sink, _ = GOOD
    ran = subprocess.run(
        [str(SERVING_CORE), "stream"],
        env=base_env(
            {
                "SERVING_HANDLER": str(handler),
                "SERVING_STREAM_SOURCE": source,
                "SERVING_STREAM_SINK": sink,
                "SERVING_STREAM_DEAD_LETTER": f"{REDIS}?maxlen=10",
            }
        ),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert ran.returncode != 0
    assert "SERVING_STREAM_DEAD_LETTER='redis://:***@redis:6379/0?maxlen=10' names no stream" in (
        ran.stderr
    )
    assert "the handler was imported" not in ran.stderr + ran.stdout
    assert "hunter2" not in ran.stderr


@pytest.mark.parametrize(
    ("url", "security"),
    [
        ("kafka://k:9092/t", {}),
        ("kafkas://k:9093/t", {"security.protocol": "SSL"}),
        (
            "kafka://svc:p%40ss@k:9092/t",
            {
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN",
                "sasl.username": "svc",
                "sasl.password": "p@ss",
            },
        ),
        (
            "kafkas://svc:pw@k:9093/t?sasl.mechanism=SCRAM-SHA-512",
            {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": "svc",
                "sasl.password": "pw",
            },
        ),
    ],
)
def test_a_kafka_urls_scheme_and_user_info_are_librdkafkas_security_properties(
    url: str, security: dict[str, str]
) -> None:
    from serving_core.stream.kafka.config import parse

    end = parse(url, "a Kafka source")
    assert {k: v for k, v in end.config.items() if k != "bootstrap.servers"} == security
    assert "pw" not in end.shown
    assert "p%40ss" not in end.shown
