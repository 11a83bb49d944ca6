"""The pipeline file: its schema, its loading, and what check and serve do with it."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest
import yaml

from serving_core.errors import HandlerError, NotReady, Overloaded
from serving_core.loading import load_handler
from serving_core.online.runner.concurrent import ConcurrentRunner
from serving_core.pipeline.config import PipelineError, parse, read
from serving_core.pipeline.pipeline import Pipeline
from tests.conftest import make_app
from tests.servers import ROOT, SERVING_CORE, base_env

STAGE = {"name": "a", "url_env": "A_URL"}
GRPC_STAGE = {"name": "g", "grpc_env": "G_GRPC", "model": "m"}


def spec(**top) -> dict:
    return {"kind": "serial", "stages": [dict(STAGE)], **top}


def with_stage(**stage) -> dict:
    return {"kind": "serial", "stages": [{**STAGE, **stage}]}


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"kind": "fan-out", "stages": [STAGE]}, "kind"),
        (spec(aggregate="most"), "aggregate"),
        (spec(aggregate="all"), "aggregate"),  # only a parallel pipeline aggregates
        (spec(stages=[]), "stages"),
        (spec(stages="a"), "stages"),
        (spec(timeout=3), "timeout"),  # unknown top-level key
        (spec(input_schema={"type": "nonsense"}), "input_schema"),
        (spec(readiness="yes"), "readiness"),
        (spec(pool_size=0), "pool_size"),
        (with_stage(name="has space"), "stages[0].name"),
        (with_stage(url_env="not-a-var"), "stages[0].url_env"),
        (with_stage(url_env="SERVING_A_URL"), "stages[0].url_env"),
        (with_stage(timeout_s=0), "stages[0].timeout_s"),
        (with_stage(timeout_s="1s"), "stages[0].timeout_s"),
        (with_stage(optional="no"), "stages[0].optional"),
        (with_stage(retries=-1), "stages[0].retries"),
        (with_stage(path="predict"), "stages[0].path"),
        (with_stage(url="http://x"), "stages[0].url"),  # unknown stage key
        (with_stage(key_env="not-a-var"), "stages[0].key_env"),
        (with_stage(key_env="SERVING_API_KEYS"), "stages[0].key_env"),
        ({"kind": "serial", "stages": [STAGE, STAGE]}, "stages[1].name"),
        ({"kind": "parallel", "stages": [{**STAGE, "into": "x"}]}, "stages[0].into"),
        # gRPC stages: grpc_env with a model, and nothing of HTTP's.
        (with_stage(grpc_env="A_GRPC", model="m"), "stages[0].url_env"),
        (with_stage(model="m"), "stages[0].model"),
        ({"kind": "serial", "stages": [GRPC_STAGE | {"path": "/x"}]}, "stages[0].path"),
        ({"kind": "serial", "stages": [GRPC_STAGE | {"model": None}]}, "stages[0].model"),
        ({"kind": "serial", "stages": [{"name": "g", "grpc_env": "G_GRPC"}]}, "stages[0].model"),
        ({"kind": "serial", "stages": [GRPC_STAGE | {"grpc_env": "x y"}]}, "stages[0].grpc_env"),
    ],
)
def test_a_bad_pipeline_file_names_the_file_and_the_key(raw, key, tmp_path):
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(PipelineError) as caught:
        read(path, {})
    assert str(caught.value).startswith(f"{path}: {key}: ")


def test_a_stage_url_that_is_not_http_is_refused_with_the_variable():
    with pytest.raises(PipelineError, match=r"stages\[0\]\.url_env: A_URL='iris:8000'"):
        parse(spec(), "p.yaml", {"A_URL": "iris:8000"})


def test_a_file_that_is_not_yaml_names_the_file(tmp_path):
    path = tmp_path / "pipeline.yaml"
    path.write_text("kind: [serial\n")
    with pytest.raises(PipelineError, match=f"^{path}: not valid YAML"):
        read(path, {})


def test_the_defaults_and_the_urls_from_the_environment_given():
    parsed = parse(
        {"kind": "parallel", "stages": [STAGE, {"name": "b", "url_env": "B_URL"}]},
        "p.yaml",
        {"A_URL": "http://a:8000/"},
        default_name="ranker",
    )
    assert (parsed.name, parsed.version, parsed.aggregate, parsed.readiness) == (
        "ranker",
        "1",
        "all",
        False,
    )
    first = parsed.stages[0]
    assert (first.timeout_s, first.optional, first.retries, first.label) == (2.0, False, 2, "a")
    assert first.endpoint == "http://a:8000/predict"
    assert parsed.unset() == ["B_URL"]


def test_a_stages_api_key_comes_from_its_key_env_and_never_shows_in_repr():
    parsed = parse(with_stage(key_env="A_KEY"), "p.yaml", {"A_URL": "http://a", "A_KEY": "s3cret"})
    stage = parsed.stages[0]
    assert (stage.key_env, stage.api_key) == ("A_KEY", "s3cret")
    assert "s3cret" not in repr(stage)
    assert "s3cret" not in repr(parsed)
    # Named but unset: serving refuses it, as it refuses an unset URL.
    unset = parse(with_stage(key_env="A_KEY"), "p.yaml", {"A_URL": "http://a"}).unset()
    assert unset == ["A_KEY"]
    with pytest.raises(PipelineError, match=r"stages\[0\]\.key_env: A_KEY must hold one key"):
        parse(with_stage(key_env="A_KEY"), "p.yaml", {"A_URL": "http://a", "A_KEY": "two keys"})


@pytest.mark.example("iris-pipeline")
@pytest.mark.parametrize(
    "spec_",
    ["handlers/iris-pipeline", "handlers/iris-pipeline/pipeline.yaml"],
)
def test_serving_handler_may_name_a_pipeline_file_or_its_folder(spec_):
    loaded = load_handler(str(ROOT / spec_), environ={"IRIS_SETOSA_URL": "http://s:8000"})
    assert isinstance(loaded.handler, Pipeline)
    assert loaded.source.endswith("handlers/iris-pipeline/pipeline.yaml")
    assert loaded.handler.name == "iris"
    assert loaded.handler.concurrent
    assert loaded.sample is not None
    assert loaded.handler.spec.unset() == ["IRIS_VERSICOLOR_URL", "IRIS_VIRGINICA_URL"]


def test_a_missing_pipeline_file_is_a_handler_error(tmp_path):
    with pytest.raises(HandlerError, match="does not exist"):
        load_handler(str(tmp_path / "pipeline.yaml"))


def test_a_concurrent_handler_with_predict_batch_is_refused(tmp_path):
    path = tmp_path / "handler.py"
    path.write_text(
        "from serving_core import Handler\n"
        "class Both(Handler):\n"
        "    concurrent = True\n"
        "    def predict_batch(self, items):\n"
        "        return items\n"
    )
    with pytest.raises(HandlerError, match="implement predict"):
        load_handler(str(path))


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SERVING_CORE), *args],
        cwd=ROOT,
        env=base_env(env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.example("iris-pipeline")
def test_check_loads_a_pipeline_and_skips_its_sample_while_the_stage_urls_are_unset():
    result = run_cli("check", "handlers/iris-pipeline")
    assert result.returncode == 0, result.stderr
    assert "its sample was not run" in result.stdout
    assert "IRIS_SETOSA_URL" in result.stdout


@pytest.mark.example("iris-pipeline")
def test_serve_stops_before_fork_naming_the_unset_stage_variable():
    result = run_cli(
        "serve",
        SERVING_HANDLER="handlers/iris-pipeline",
        IRIS_SETOSA_URL="http://127.0.0.1:9",
        IRIS_VERSICOLOR_URL="http://127.0.0.1:9",
    )
    assert result.returncode == 2
    assert "pipeline.yaml" in result.stderr
    assert "IRIS_VIRGINICA_URL are not set" in result.stderr


def test_serve_stops_on_a_bad_pipeline_file_naming_the_file_and_the_key(tmp_path):
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(with_stage(timeout_s=-1)))
    result = run_cli("serve", SERVING_HANDLER=str(tmp_path))
    assert result.returncode == 2
    assert f"{tmp_path / 'pipeline.yaml'}: stages[0].timeout_s: must be a positive" in result.stderr


def test_a_concurrent_handler_runs_in_the_request_and_refuses_beyond_max_queue(tmp_path):
    path = tmp_path / "handler.py"
    path.write_text(
        "import threading\n"
        "from serving_core import Handler\n"
        "class Waiter(Handler):\n"
        "    concurrent = True\n"
        "    entered = threading.Event()\n"
        "    release = threading.Event()\n"
        "    def predict(self, item):\n"
        "        self.entered.set()\n"
        "        self.release.wait(10)\n"
        "        return {'thread': threading.current_thread().name}\n"
    )
    app = make_app(handler=str(path), max_queue=1, max_batch_size=1)
    service = app.extensions["serving_core"]
    service.start()
    try:
        assert isinstance(service.runner, ConcurrentRunner)
        assert service.ready
        handler = service.handler
        answers: list[dict] = []
        first = threading.Thread(
            target=lambda: answers.append(service.predict({}, request_id="one")), name="req-1"
        )
        first.start()
        assert handler.entered.wait(10)
        with pytest.raises(Overloaded) as refused:
            service.predict({}, request_id="two")
        assert refused.value.reason == "queue_full"
        handler.release.set()
        first.join(10)
        assert answers == [{"thread": "req-1"}]  # predict ran in the request's own thread
        assert service.predict({}, request_id="three") == {
            "thread": threading.current_thread().name
        }
    finally:
        service.stop()
    assert not service.ready
    with pytest.raises(NotReady):
        service.admit()  # a stopped worker takes no more requests


@pytest.mark.parametrize("target", ["http://ids:8001", "ids", "ids:8001/v2"])
def test_a_grpc_stage_target_that_is_not_host_port_is_refused_with_the_variable(target):
    raw = {"kind": "serial", "stages": [GRPC_STAGE]}
    with pytest.raises(PipelineError, match=r"stages\[0\]\.grpc_env: G_GRPC=.* is not host:port"):
        parse(raw, "p.yaml", {"G_GRPC": target})


def test_a_grpc_stage_reads_its_target_model_and_key():
    raw = {"kind": "serial", "stages": [GRPC_STAGE | {"key_env": "G_KEY", "retries": 1}]}
    (stage,) = parse(raw, "p.yaml", {"G_GRPC": "ids:8001", "G_KEY": "k-1"}).stages
    assert (stage.protocol, stage.url, stage.model) == ("grpc", "ids:8001", "m")
    assert (stage.api_key, stage.retries) == ("k-1", 1)
    assert parse(raw, "p.yaml", {}).unset() == ["G_GRPC", "G_KEY"]


def test_the_example_pipeline_files_parse():
    for path in sorted(Path(ROOT / "handlers").glob("*/pipeline.yaml")):
        read(path, {})
