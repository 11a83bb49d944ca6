"""``settings.secrets.masked``: the one way a URL loses its password before it is shown."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest

from serving_core.settings import Settings
from serving_core.settings.secrets import masked, scrubbed
from tests.servers import ROOT, free_port, spawn, stop, wait_for


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://user:s3cret@cache:6379/0", "redis://user:***@cache:6379/0"),
        ("redis://:s3cret@cache:6379/0", "redis://:***@cache:6379/0"),
        ("amqp://u:p@ss@rabbit:5672/%2F?queue=q", "amqp://u:***@rabbit:5672/%2F?queue=q"),
        ("amqp://u:p@s/s@rabbit/%2F?queue=q", "amqp://u:***@rabbit/%2F?queue=q"),
        # A raw @ in the path cannot be told from one in the password: hidden too.
        ("amqp://u:s3cret@rabbit/v@host?queue=q", "amqp://u:***@host?queue=q"),
        ("rediss://u:s3cret@[::1]:6380?stream=a@b", "rediss://u:***@[::1]:6380?stream=a@b"),
        (
            "kafka://k:9092/t?sasl_username=u&sasl_password=s3cret&group=g",
            "kafka://k:9092/t?sasl_username=u&sasl_password=***&group=g",
        ),
        ("toy:///q?token=s3cret", "toy:///q?token=***"),
        # Presigned and SAS URLs: the signature and the credential are the secret.
        (
            "https://b.s3.amazonaws.com/m.onnx?X-Amz-Credential=s3cret&X-Amz-Date=1"
            "&X-Amz-Signature=s3cret",
            "https://b.s3.amazonaws.com/m.onnx?X-Amz-Credential=***&X-Amz-Date=1"
            "&X-Amz-Signature=***",
        ),
        (
            "https://a.blob.core.windows.net/c/m.onnx?sv=2022&sp=r&sig=s3cret",
            "https://a.blob.core.windows.net/c/m.onnx?sv=2022&sp=r&sig=***",
        ),
        (
            "https://storage.googleapis.com/b/m.onnx?X-Goog-Signature=s3cret&x=1",
            "https://storage.googleapis.com/b/m.onnx?X-Goog-Signature=***&x=1",
        ),
        ("user:s3cret@cache:6379/0", "user:***@cache:6379/0"),
    ],
)
def test_a_password_is_hidden_whole_wherever_its_at_signs_are(url: str, shown: str) -> None:
    assert masked(url) == shown
    assert "s3cret" not in masked(url)


@pytest.mark.parametrize(
    "url",
    [
        "redis://cache:6379/0",
        "redis://user@cache:6379/0",
        "unix:///run/redis.sock?db=1",
        "amqp://rabbit/%2F?exchange=&routing_key=q",
        "",
        "cache:6379",
    ],
)
def test_a_url_without_a_password_is_shown_as_it_is(url: str) -> None:
    assert masked(url) == url


PASSWORD = "s3cr/et@x#y"  # a raw '/', '@' and '#': the characters people leave unescaped


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # M3: redis-py's own form for a unix socket's password, and other spellings.
        ("unix:///run/redis.sock?password=s3cret&db=0", "unix:///run/redis.sock?password=***&db=0"),
        ("redis://cache/0?db=1&Password=s3cret", "redis://cache/0?db=1&Password=***"),
        ("redis://cache/0?pass=s3cret", "redis://cache/0?pass=***"),
        ("redis://cache/0?pwd=s3cret&x=1", "redis://cache/0?pwd=***&x=1"),
        ("https://c/e?api_key=s3cret&key=s3cret", "https://c/e?api_key=***&key=***"),
        ("https://c/e?auth=s3cret&monkey=1", "https://c/e?auth=***&monkey=1"),
        ("https://c/e#access_token=s3cret", "https://c/e#access_token=***"),
        # A raw '#' or '&' in a query password: the rest of it is still the password.
        ("unix:///r.sock?password=s3cret#tail", "unix:///r.sock?password=***"),
        ("unix:///r.sock?password=s3c&ret&db=0", "unix:///r.sock?password=***&db=0"),
        # A raw '?' or '#' in a user info password: its '@' comes after it.
        ("redis://:s3c#ret@cache:6379/0", "redis://:***@cache:6379/0"),
        ("redis://u:s3c?ret@cache/0", "redis://u:***@cache/0"),
        ("redis://:1234#s3cret@cache", "redis://:***@cache"),
        (f"unix://:{PASSWORD}@/run/redis.sock", "unix://:***@/run/redis.sock"),
    ],
)
def test_m3_query_passwords_and_raw_separators_are_hidden(url: str, shown: str) -> None:
    """M3: a password in the query (redis-py's ``?password=``) is hidden like one in the
    user info, whatever unescaped characters it holds."""
    assert masked(url) == shown
    assert "s3c" not in masked(url)


def test_an_at_sign_in_the_query_after_a_port_is_no_user_info() -> None:
    assert masked("redis://cache:6379?stream=a@b") == "redis://cache:6379?stream=a@b"


def test_scrubbed_hides_a_urls_secrets_wherever_a_message_repeats_them() -> None:
    url = "postgresql://reader:p%2Fw0rd@db:5432/x?sslpassword=k3y"
    said = f"cannot open {url}: password 'p/w0rd' or key k3y refused; p/w0rdy is another word"
    assert scrubbed(said, url) == (
        "cannot open postgresql://reader:***@db:5432/x?sslpassword=***: password '***' "
        "or key *** refused; p/w0rdy is another word"
    )


def test_i3_the_settings_repr_shows_every_url_without_its_password() -> None:
    """I3: Settings are printed and logged; their repr carried each URL's password."""
    settings = Settings.from_env(
        {
            "SERVING_CACHE_URL": f"redis://:{PASSWORD}@cache:6379/0",
            "SERVING_JOBS_URL": "unix:///run/redis.sock?password=s3cret&db=0",
            "SERVING_STREAM_SOURCE": "amqp://u:s3cret@rabbit/%2F?queue=in",
            "SERVING_PAYLOAD_LOG_URL": "https://u:s3cret@collector/events",
            "SERVING_MODEL_URI": "https://b.s3.amazonaws.com/m?X-Amz-Signature=s3cret",
            "SERVING_API_KEYS": "k" * 20,
        },
        cores=1,
    )
    for shown in (repr(settings), str(settings), f"{settings}"):
        assert "s3c" not in shown
        assert "k" * 20 not in shown
        assert "cache_url='redis://:***@cache:6379/0'" in shown
        assert "jobs_url='unix:///run/redis.sock?password=***&db=0'" in shown
        assert "stream_source='amqp://u:***@rabbit/%2F?queue=in'" in shown
    assert settings.cache_url == f"redis://:{PASSWORD}@cache:6379/0"  # only its repr changed


def _logged_until(command: str, env: dict[str, str], line: str, tmp_path: Path) -> str:
    """What ``serving-core COMMAND`` writes to its log until ``line`` is in it."""
    log_path = tmp_path / f"{command}.log"
    process = spawn(command, {"SERVING_BIND": f"127.0.0.1:{free_port()}", **env}, log_path)
    try:
        wait_for(lambda: line in log_path.read_text(), log_path.read_text)
    finally:
        stop(process)
    return log_path.read_text()


@pytest.mark.e2e
def test_m3_worker_logs_its_redis_without_the_query_password(tmp_path: Path) -> None:
    """M3: ``serving-core worker``'s warning about a Redis it cannot check showed a
    unix socket URL's ``?password=``."""
    socket = tmp_path / "none.sock"
    logged = _logged_until(
        "worker",
        {
            "SERVING_HANDLER": str(ROOT / "tests/handlers/probe/handler.py"),
            "SERVING_JOBS_URL": f"unix://{socket}?password={quote(PASSWORD)}&db=0",
        },
        "could not check the job queue's Redis",
        tmp_path,
    )
    assert f"unix://{socket}?password=***&db=0" in logged
    assert "s3cr" not in logged


@pytest.mark.e2e
def test_m3_stream_logs_its_source_without_the_query_password(tmp_path: Path) -> None:
    """M3: ``serving-core stream``'s start line showed its source's ``?password=``."""
    socket = tmp_path / "none.sock"
    ends = {
        f"SERVING_STREAM_{end}": f"unix://{socket}?password={quote(PASSWORD)}&stream={end.lower()}"
        for end in ("SOURCE", "SINK", "DEAD_LETTER")
    }
    logged = _logged_until(
        "stream",
        {"SERVING_HANDLER": str(ROOT / "tests/handlers/probe/handler.py"), **ends},
        "consumer(s) of",
        tmp_path,
    )
    assert f"consumer(s) of unix://{socket}?password=***&stream=source" in logged
    assert "s3cr" not in logged
