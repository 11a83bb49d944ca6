"""The job queue's Redis is checked, not trusted: an evicting one is refused at start (through
the real CLI), one that may lose jobs is a warning, and a loss that happens anyway is logged
and counted in the worker's /metrics. Real redis-servers, configured as each case needs."""

from __future__ import annotations

import logging

import pytest
import redis
import requests
import yaml

from serving_core.jobs.backends import open_queue
from serving_core.jobs.base import StoreRefused
from serving_core.jobs.redis.durability import check_redis
from serving_core.settings import Settings
from tests.conftest import PROBE
from tests.redis_server import redis_server
from tests.servers import ROOT, free_port, job_worker, spawn, stop, wait_for

pytestmark = pytest.mark.e2e

EVICTING = ["--maxmemory-policy", "allkeys-lru"]


@pytest.mark.parametrize("verb", ["serve", "worker"])
def test_an_evicting_redis_is_refused_at_start_by_name_without_its_password(verb, tmp_path):
    with redis_server(options=[*EVICTING, "--requirepass", "s3cret-pw"]) as url:
        env = {
            "SERVING_HANDLER": PROBE,
            "SERVING_JOBS_URL": url.replace("redis://", "redis://:s3cret-pw@"),
            "SERVING_BIND": f"127.0.0.1:{free_port()}",
        }
        log_path = tmp_path / f"{verb}.log"
        process = spawn(verb, env, log_path)
        try:
            status = process.wait(60)
        finally:
            stop(process)
    output = log_path.read_text()
    assert status == 2, output
    assert "maxmemory-policy allkeys-lru" in output
    assert "Set maxmemory-policy noeviction" in output
    assert "s3cret-pw" not in output
    assert " ready: " not in output  # refused before any worker started


def test_an_evicting_redis_is_refused_when_config_is_renamed_from_info(caplog):
    options = [*EVICTING, "--rename-command", "CONFIG", ""]
    refused = pytest.raises(StoreRefused, match="maxmemory-policy allkeys-lru")
    with redis_server(options=options) as url, caplog.at_level(logging.WARNING), refused:
        check_redis(url)
    assert "refused CONFIG GET" in caplog.text


@pytest.mark.parametrize(
    ("options", "warning"),
    [
        ([], "has AOF off (appendonly no)"),
        (["--appendonly", "yes", "--appendfsync", "everysec"], "has appendfsync everysec"),
        (["--appendonly", "yes", "--appendfsync", "always"], None),
    ],
)
def test_a_redis_that_may_lose_jobs_is_a_warning_and_one_that_fsyncs_each_write_is_not(
    options, warning, caplog
):
    options = ["--maxmemory-policy", "noeviction", *options]
    with redis_server(options=options) as url, caplog.at_level(logging.WARNING):
        check_redis(url)
    if warning is None:
        assert caplog.records == []
    else:
        [record] = caplog.records
        assert warning in record.getMessage()


def test_an_unreachable_redis_is_a_warning_not_a_refusal(caplog):
    with caplog.at_level(logging.WARNING, logger="serving_core"):
        check_redis(f"redis://127.0.0.1:{free_port()}/0")
    assert "could not check the job queue's Redis" in caplog.text


def test_a_missing_job_record_and_a_recreated_group_are_logged_and_counted(tmp_path):
    with redis_server() as url:
        env = {"SERVING_JOBS_URL": url, "SERVING_WORKERS": "1"}
        queue = open_queue(Settings(jobs_url=url), "probe")  # the probe worker's queue
        client = redis.Redis.from_url(url, decode_responses=True)
        try:
            with job_worker(env, tmp_path) as (_, health, log_path):

                def lost(kind: str) -> float:
                    line = f'serving_jobs_lost_total{{kind="{kind}"}} '
                    text = requests.get(health + "/metrics", timeout=10).text
                    [value] = [r[len(line) :] for r in text.splitlines() if r.startswith(line)]
                    return float(value)

                assert lost("record_missing") == lost("group_recreated") == 0
                # A queued job whose record is gone (as an evicting Redis would leave it).
                client.xadd(queue.stream, {"job": "evicted-job-id"})
                wait_for(lambda: lost("record_missing") == 1, "the missing record counted")
                assert client.xlen(queue.stream) == 0  # its entry dropped, not retried
                assert "evicted-job-id" in log_path.read_text()
                # The stream gone under the worker (a flushed or restarted Redis).
                client.delete(queue.stream)
                wait_for(lambda: lost("group_recreated") == 1, "the recreated group counted")
                assert "created again" in log_path.read_text()
        finally:
            client.close()
            queue.close()


def test_the_compose_stacks_redis_passes_the_check_without_a_warning(caplog):
    """docker-compose.yml's Redis flags, run by Debian's redis-server: what the
    guarantees page promises (appendfsync always, noeviction), and nothing to warn of."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    command = compose["services"]["redis"]["command"]
    assert command[0] == "redis-server"
    with redis_server(options=command[1:]) as url, caplog.at_level(logging.WARNING):
        check_redis(url)
        with redis.Redis.from_url(url, decode_responses=True) as client:
            config = client.config_get("*")
    assert caplog.records == []
    assert (config["appendfsync"], config["maxmemory-policy"]) == ("always", "noeviction")
