"""image.yml and chart.yml: what is built, tested, tagged, pushed and attested, and
when (the `if:` conditions evaluated against sample events)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.workflows import (
    ROOT,
    evaluate,
    step_named,
    steps,
    strings,
    uses,
    workflow,
)

NOT_ON_PRS = "github.event_name != 'pull_request'"


def push_job() -> dict[str, Any]:
    job: dict[str, Any] = workflow("image")["jobs"]["push"]
    return job


def loads() -> list[dict[str, Any]]:
    """The image job's builds, loaded into the runner's docker for the tests."""
    return uses("image", "docker/build-push-action", job="image")


def the_push() -> dict[str, Any]:
    """The one build-push step that pushes, run once per image of the push matrix."""
    (build,) = uses("image", "docker/build-push-action", job="push")
    return build


def legs(ref: str) -> list[dict[str, Any]]:
    """The push job's matrix expanded for a push to ``ref``, as Actions expands it:
    the product of the lists, less `exclude`, each extended by the `include`
    entries that match it (none of these adds a leg of its own)."""
    matrix = push_job()["strategy"]["matrix"]
    context = {"github": {"ref": ref, "event_name": "push"}}
    lists = {
        key: evaluate(value, context) if isinstance(value, str) else value
        for key, value in matrix.items()
        if key not in {"include", "exclude"}
    }
    combos: list[dict[str, Any]] = [{}]
    for key, values in lists.items():
        combos = [{**c, key: v} for c in combos for v in values]
    combos = [
        c for c in combos if not any(e.items() <= c.items() for e in matrix.get("exclude", []))
    ]
    for extra in matrix.get("include", []):
        matching = [c for c in combos if all(c.get(k, v) == v for k, v in extra.items() if k in c)]
        assert matching, f"include {extra} would add a leg of its own"
        for combo in matching:
            combo.update({k: v for k, v in extra.items() if k not in lists})
    return combos


def run_step(step: dict[str, Any], env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """A `run:` step run by bash as on the runner, for repository Serving-Core/serving-core:
    the outputs it wrote."""
    output = tmp_path / f"output-{len(list(tmp_path.iterdir()))}"
    output.write_text("")
    result = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", step["run"]],
        env={
            "PATH": os.environ["PATH"],
            "GITHUB_OUTPUT": str(output),
            "GITHUB_REPOSITORY": "Serving-Core/serving-core",
            **env,
        },
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return dict(line.split("=", 1) for line in output.read_text().splitlines())


def names(leg: dict[str, Any], tmp_path: Path) -> dict[str, str]:
    """The push job's `Image names` step run for one leg: its outputs."""
    step = step_named("image", "Image names", job="push")
    env = {k: evaluate(v, {"matrix": leg}) for k, v in step["env"].items()}
    return run_step(step, env, tmp_path)


def test_image_builds_both_dockerfiles_and_tests_them_before_pushing() -> None:
    contexts = [b["with"]["context"] for b in loads()]
    assert contexts == [".", "nginx"]
    pushed = {leg["context"] for leg in legs("refs/tags/v1.2.3")}
    assert pushed == set(contexts)
    for context in contexts:
        assert (ROOT / context / "Dockerfile").is_file()
    order = [s.get("name") for s in steps("image", "image")]
    tests_at = order.index("Container tests")
    for build in loads():
        assert build["with"]["load"] is True
        assert "push" not in build["with"]
        assert order.index(build["name"]) < tests_at
    # Pushed only once the image job, its container tests included, passed;
    # one leg's failure cancels no other's push half-way.
    assert push_job()["needs"] == "image"
    assert push_job()["strategy"]["fail-fast"] is False
    assert the_push()["with"]["push"] is True
    assert the_push()["with"]["context"] == "${{ matrix.context }}"


def test_container_tests_get_the_built_image_names() -> None:
    loaded = workflow("image")
    test_step = step_named("image", "Container tests")
    assert "pytest tests/container" in test_step["run"]
    assert test_step["env"]["SERVING_TEST_IMAGE"] == "${{ env.TEST_IMAGE }}"
    assert test_step["env"]["SERVING_TEST_NGINX_IMAGE"] == "${{ env.TEST_NGINX_IMAGE }}"
    app, nginx = loads()
    assert app["with"]["tags"] == "${{ env.TEST_IMAGE }}"
    assert nginx["with"]["tags"] == "${{ env.TEST_NGINX_IMAGE }}"
    assert set(loaded["jobs"]["image"]["env"]) == {"TEST_IMAGE", "TEST_NGINX_IMAGE"}


def build_args(step: dict[str, Any], leg: dict[str, Any] | None = None) -> dict[str, str]:
    """A build step's arguments; ``${{ matrix.KEY }}`` replaced by ``leg``'s value."""
    lines = step["with"].get("build-args", "").splitlines()
    if leg is not None:
        lines = [re.sub(r"\$\{\{ matrix\.(\w+) \}\}", lambda m: leg[m[1]], x) for x in lines]
    return dict(line.strip().split("=", 1) for line in lines if line.strip())


def test_one_workflow_variable_names_the_handler_every_app_build_and_test_uses() -> None:
    loaded = workflow("image")
    handler_dir = ROOT / loaded["env"]["HANDLER_DIR"]
    assert (handler_dir / "handler.py").is_file()
    assert (handler_dir / "sample.json").is_file()
    app_builds = [loads()[0], the_push()]  # tested; pushed (CPU and CUDA)
    for build in app_builds:
        assert build_args(build)["HANDLER_DIR"] == "${{ env.HANDLER_DIR }}", build["name"]
        assert build_args(build)["SHARED_DIRS"] == "${{ env.SHARED_DIRS }}", build["name"]
    test_env = step_named("image", "Container tests")["env"]
    assert test_env["SERVING_TEST_HANDLER_DIR"] == "${{ env.HANDLER_DIR }}"
    # Nothing else in the workflow names a handler folder.
    named = [s for s in strings(loaded) if "handlers/" in s]
    assert named == [loaded["env"]["HANDLER_DIR"]]


def test_the_tested_app_build_takes_the_cpu_legs_arguments() -> None:
    # Same arguments, same layers: the push finds the tested layers in the cache.
    (cpu_app,) = [leg for leg in legs("refs/heads/main") if leg["image"] == "app"]
    assert build_args(loads()[0]) == build_args(the_push(), cpu_app)


def test_pull_requests_build_without_logging_in_pushing_or_writing_the_cache() -> None:
    assert "pull_request" in workflow("image")["on"]
    assert uses("image", "docker/login-action", job="image")[0]["if"] == NOT_ON_PRS
    assert push_job()["if"] == NOT_ON_PRS
    assert "if" not in the_push()
    outputs = {"names": {"outputs": {"app": "ghcr.io/o/r", "nginx": "ghcr.io/o/r-nginx"}}}
    for build in loads():
        cache_to = build["with"]["cache-to"]
        on_pr = {"github": {"event_name": "pull_request"}, "steps": outputs}
        on_push = {"github": {"event_name": "push"}, "steps": outputs}
        assert evaluate(cache_to, on_pr) == "", build["name"]
        # The tested layers, for the push job's build (the same ref it reads).
        written = evaluate(cache_to, on_push)
        read = (
            build["with"]["cache-from"].replace("${{ steps.names.outputs.", "{").replace(" }}", "}")
        )
        assert written == read.format(**outputs["names"]["outputs"]) + ",mode=max"
    assert the_push()["with"]["cache-to"].startswith(the_push()["with"]["cache-from"])


def test_the_push_reads_the_cache_the_tested_builds_wrote(tmp_path: Path) -> None:
    tested = run_step(step_named("image", "Image names", job="image"), {}, tmp_path)
    on_push = {"github": {"event_name": "push"}, "steps": {"names": {"outputs": tested}}}
    written = {evaluate(b["with"]["cache-to"], on_push) for b in loads()}
    read = the_push()["with"]["cache-from"]
    for leg in legs("refs/heads/main"):
        ref = read.replace("${{ steps.names.outputs.cache }}", names(leg, tmp_path)["cache"])
        assert f"{ref},mode=max" in written, leg


def test_images_go_to_ghcr_with_sha_branch_semver_and_latest_tags(tmp_path: Path) -> None:
    (meta,) = uses("image", "docker/metadata-action")
    assert meta["with"]["images"] == "${{ steps.names.outputs.image }}"
    images = {leg["image"]: names(leg, tmp_path)["image"] for leg in legs("refs/heads/main")}
    assert images == {
        "app": "ghcr.io/serving-core/serving-core",
        "nginx": "ghcr.io/serving-core/serving-core-nginx",
    }
    tags = meta["with"]["tags"].split()
    assert "type=sha,format=long" in tags
    assert "type=ref,event=branch" in tags
    assert "type=semver,pattern={{version}}" in tags
    assert "type=raw,value=latest,enable={{is_default_branch}}" in tags
    # latest is the default branch's only, never moved by a tag.
    assert "latest=false" in meta["with"]["flavor"].splitlines()
    for build in [*loads(), the_push()]:
        assert build["with"]["cache-from"].startswith("type=registry,ref=")


def test_the_oci_labels_are_set_once_by_the_metadata_action(tmp_path: Path) -> None:
    (meta,) = uses("image", "docker/metadata-action")
    assert the_push()["with"]["labels"] == "${{ steps.meta.outputs.labels }}"
    for build in [*loads(), the_push()]:
        # No label by build argument: the Dockerfiles' LABEL defaults mark a
        # local build, the metadata action's --label flags replace them in CI.
        assert not {"VERSION", "REVISION", "SOURCE"} & set(build_args(build)), build["name"]
    titles = {leg["image"]: names(leg, tmp_path)["title"] for leg in legs("refs/tags/v1.2.3")}
    assert titles == {"app": "serving-core", "nginx": "serving-core-nginx"}
    assert (
        "org.opencontainers.image.title=${{ steps.names.outputs.title }}"
        in meta["with"]["labels"].splitlines()
    )


def test_every_pushed_image_carries_an_sbom_and_max_provenance() -> None:
    assert the_push()["with"]["sbom"] is True
    assert the_push()["with"]["provenance"] == "mode=max"


def test_only_the_builds_loaded_for_the_tests_leave_attestations_out() -> None:
    # docker's image store loads one platform's image, not an index with
    # attestation manifests beside it.
    for build in uses("image", "docker/build-push-action"):
        if build["with"].get("provenance") is False:
            assert build["with"]["load"] is True, build["name"]


def digest_source(job: str, attest: dict[str, Any]) -> dict[str, Any]:
    """The step whose `digest` output an attest step signs."""
    step = attest["with"]["subject-digest"].split(".")[1]
    (source,) = [s for s in steps("image", job) if s.get("id") == step]
    return source


@pytest.mark.parametrize("job", ["push", "chart"])
def test_every_pushed_digest_gets_a_provenance_attestation_in_the_registry(job: str) -> None:
    attests = uses("image", "actions/attest-build-provenance", job=job)
    # The push job's one build-push step; the chart job pushes with `helm push`.
    assert {digest_source(job, a)["id"] for a in attests} == {"push"}
    order = [s.get("name") for s in steps("image", job)]
    for attest in attests:
        source = digest_source(job, attest)
        assert attest["with"]["push-to-registry"] is True
        # Attested exactly when pushed (never on pull requests), after the push.
        assert attest.get("if") == source.get("if")
        assert order.index(source["name"]) < order.index(attest["name"])
    (attest,) = uses("image", "actions/attest-build-provenance", job="push")
    # Each leg's image, the one its metadata step tags.
    assert attest["with"]["subject-name"] == "${{ steps.names.outputs.image }}"
    (meta,) = uses("image", "docker/metadata-action", job="push")
    assert meta["with"]["images"] == attest["with"]["subject-name"]


def test_the_cpu_images_are_pushed_for_amd64_and_arm64_under_qemu() -> None:
    loaded = workflow("image")
    assert loaded["env"]["PLATFORMS"].split(",") == ["linux/amd64", "linux/arm64"]
    platforms = the_push()["with"]["platforms"]
    for leg in legs("refs/tags/v1.2.3"):
        pushed = evaluate(platforms, {"matrix": leg, "env": loaded["env"]})
        # The CUDA image for the GPU nodes' x86 hosts only.
        expected = "linux/amd64" if leg["torch"] != "cpu" else loaded["env"]["PLATFORMS"]
        assert pushed == expected, leg
    for build in loads():
        # The runner's own platform, for the container tests.
        assert "platforms" not in build["with"]
    (qemu,) = uses("image", "docker/setup-qemu-action", job="push")
    assert qemu["with"]["platforms"] == "arm64"
    assert evaluate(qemu["if"], {"matrix": {"torch": "cpu"}}) is True
    assert evaluate(qemu["if"], {"matrix": {"torch": "cu128"}}) is False
    order = [s.get("name") for s in steps("image", "push")]
    assert order.index(qemu["name"]) < order.index("Set up Buildx")


def test_the_chart_push_hands_its_digest_to_the_attestation(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    helm = fake / "helm"
    digest = "sha256:" + "c" * 64
    # What helm push prints: the reference, then the manifest digest.
    helm.write_text(
        "#!/bin/sh\ncat > /dev/null\n"
        '[ "$1" = push ] && printf \'Pushed: %s\\nDigest: %s\\n\' "$3/serving-core:1.2.3" '
        f"'{digest}' >&2\nexit 0\n"
    )
    helm.chmod(0o755)
    output = tmp_path / "output"
    output.write_text("")
    result = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", step_named("image", "Push", job="chart")["run"]],
        env={
            "PATH": f"{fake}:{os.environ['PATH']}",
            "GITHUB_OUTPUT": str(output),
            "GITHUB_REPOSITORY": "Serving-Core/Serving-Core",
            "GITHUB_ACTOR": "someone",
            "GHCR_TOKEN": "t",
            "ARCHIVE": "dist/serving-core-1.2.3.tgz",
        },
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert dict(line.split("=", 1) for line in output.read_text().splitlines()) == {
        "name": "ghcr.io/serving-core/serving-core/charts/serving-core",
        "digest": digest,
    }


def tag_push(ref: str) -> dict[str, Any]:
    return {"github": {"ref": ref, "event_name": "push"}}


RELEASE_REFS = {
    "refs/tags/v1.2.3": True,
    "refs/tags/v1.2.3-rc.1": True,
    "refs/heads/main": False,
    "refs/pull/7/merge": False,
}


@pytest.mark.parametrize("ref", RELEASE_REFS)
def test_the_cuda_image_is_built_on_version_tags_only(ref: str) -> None:
    pushed = sorted((leg["image"], leg["torch"]) for leg in legs(ref))
    cuda = [("app", "cu128")] if RELEASE_REFS[ref] else []
    assert pushed == sorted([("app", "cpu"), ("nginx", "cpu"), *cuda])


def test_the_cuda_image_is_the_same_handler_with_cu128_torch_tagged_with_a_suffix(
    tmp_path: Path,
) -> None:
    (cuda,) = [leg for leg in legs("refs/tags/v1.2.3") if leg["torch"] != "cpu"]
    assert cuda["torch"] == "cu128"
    args = build_args(the_push(), cuda)
    assert args["TORCH_VARIANT"] == "cu128"
    assert args["HANDLER_DIR"] == "${{ env.HANDLER_DIR }}"
    outputs = names(cuda, tmp_path)
    # Its own cache, beside the CPU image's.
    assert outputs["cache"] == "ghcr.io/serving-core/serving-core:buildcache-cu128"
    assert (
        the_push()["with"]["cache-to"]
        == "type=registry,ref=${{ steps.names.outputs.cache }},mode=max"
    )
    # v1.2.3 -> 1.2.3-cu128 and 1.2-cu128 (what the chart's values-gpu.yaml uses);
    # every tag suffixed, so no CUDA image takes a CPU tag or latest.
    assert outputs["suffix"] == "-cu128"
    for leg in legs("refs/tags/v1.2.3"):
        if leg["torch"] == "cpu":
            assert names(leg, tmp_path)["suffix"] == ""
    (meta,) = uses("image", "docker/metadata-action")
    flavor = meta["with"]["flavor"].splitlines()
    assert "suffix=${{ steps.names.outputs.suffix }}" in flavor
    assert "latest=false" in flavor
    gpu_values = (ROOT / "helm" / "serving-core" / "examples" / "values-gpu.yaml").read_text()
    assert re.search(r'tag: "\d+\.\d+\.\d+-cu128"', gpu_values)


def test_the_cuda_leg_makes_room_on_the_runner_first() -> None:
    room = step_named("image", "Make room for the CUDA layers", job="push")
    assert evaluate(room["if"], {"matrix": {"torch": "cu128"}}) is True
    assert evaluate(room["if"], {"matrix": {"torch": "cpu"}}) is False
    assert steps("image", "push")[0] == room


@pytest.mark.parametrize("ref", RELEASE_REFS)
def test_the_chart_is_published_on_version_tags_only_after_every_image(ref: str) -> None:
    job = workflow("image")["jobs"]["chart"]
    # The whole push matrix, the CUDA image included.
    assert job["needs"] == "push"
    assert evaluate(job["if"], tag_push(ref)) is RELEASE_REFS[ref]


def test_chart_is_packaged_with_the_image_tag_as_app_version_and_pushed() -> None:
    assert "publish" not in workflow("chart")["jobs"]
    assert "tags" not in workflow("chart")["on"]["push"]
    package = step_named("image", "Package")["run"]
    # The image job tags v1.2.3's images 1.2.3 (type=semver,pattern={{version}}).
    assert 'version="${GITHUB_REF_NAME#v}"' in package
    assert 'helm lint --strict "$CHART_DIR"' in package
    assert '--version "$version" --app-version "$version"' in package
    push = step_named("image", "Push")["run"]
    assert "helm registry login ghcr.io" in push
    assert 'helm push "$ARCHIVE" "oci://ghcr.io/' in push
    assert workflow("image")["env"]["CHART_DIR"] == workflow("chart")["env"]["CHART_DIR"]


def test_chart_lint_covers_every_example_on_pushes_and_pull_requests() -> None:
    loaded = workflow("chart")
    assert {"push", "pull_request"} <= set(loaded["on"])
    lint = step_named("chart", "helm lint --strict, helm template every example")["run"]
    assert 'for values in "$CHART_DIR"/examples/values-*.yaml' in lint
    assert 'helm lint --strict "$CHART_DIR" --values "$values"' in lint
    assert loaded["env"]["CHART_DIR"] == "helm/serving-core"
    assert (ROOT / "helm" / "serving-core" / "Chart.yaml").is_file()
