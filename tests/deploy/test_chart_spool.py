"""nginx.bodySpoolSize fits under tmpSizeLimit, the size of nginx's /tmp: the render
stops otherwise, saying which to change. The two are written differently: an nginx
size's k, m and g are binary in either case (nginx/entrypoint.sh's ``bytes_of``), a
Kubernetes quantity's Ki, Mi and Gi binary and its k, M and G decimal; each case here
sits one step from the boundary."""

from __future__ import annotations

import re

import helm_python as helm
import pytest

from tests.deploy.chart import containers, env_of, find, render, tagged

MiB = 1 << 20


def values(spool: int | str, tmp: str | None) -> dict[str, object]:
    chosen: dict[str, object] = {"nginx": {"bodySpoolSize": spool}}
    if tmp is not None:
        chosen["tmpSizeLimit"] = tmp
    return tagged(chosen)


@pytest.mark.parametrize(
    ("spool", "tmp"),
    [
        ("255m", "256Mi"),
        (256 * MiB - 1, "256Mi"),
        ("256m", str(256 * MiB + 1)),  # a bare quantity is bytes
        ("953m", "1G"),  # 999,292,928 bytes: G is 10**9
        (10**9 - 1, "1G"),
        ("976k", "1M"),  # 999,424 bytes
        ("1953k", "2000k"),  # 1,999,872 bytes: k is 1000 in a quantity
        ("1023", "1Ki"),
        ("1g", "2Gi"),
        (0, "1Ki"),  # 0: no cap, so nothing to fit
    ],
)
def test_a_spool_under_tmp_renders(chart: helm.Chart, spool: int | str, tmp: str) -> None:
    nginx = env_of(containers(find(render(chart, values(spool, tmp)), "Deployment"))["nginx"])
    assert nginx["NGINX_BODY_SPOOL_BYTES"] == str(spool)


@pytest.mark.parametrize(
    ("spool", "tmp", "spool_bytes"),
    [
        ("256m", "256Mi", 256 * MiB),
        (256 * MiB, "256Mi", 256 * MiB),
        ("256M", str(256 * MiB), 256 * MiB),  # nginx's M is m
        ("954m", "1G", 954 * MiB),
        (10**9, "1G", 10**9),
        ("977k", "1M", 977 * 1024),
        ("1954k", "2000k", 1954 * 1024),
        ("1K", "1Ki", 1024),
        ("1g", "1Gi", 1 << 30),
        ("257m", None, 257 * MiB),  # over the default 256Mi
    ],
)
def test_a_spool_that_fills_tmp_is_refused_saying_what_to_change(
    chart: helm.Chart, spool: int | str, tmp: str | None, spool_bytes: int
) -> None:
    written = spool if isinstance(spool, str) else str(spool)
    message = (
        f"nginx.bodySpoolSize ({written}, {spool_bytes} bytes) does not fit under "
        f"tmpSizeLimit ({tmp or '256Mi'}, "
    )
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)) as refused:
        render(chart, values(spool, tmp))
    assert "lower nginx.bodySpoolSize or raise tmpSizeLimit" in str(refused.value)
