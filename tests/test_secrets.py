"""``settings.secrets.masked``: the one way a URL loses its password before it is shown."""

from __future__ import annotations

import pytest

from serving_core.settings.secrets import masked


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
