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


def test_image_builds_both_dockerfiles_and_tests_them_before_pushing() -> None:
    builds = uses("image", "docker/build-push-action", job="image")
    contexts = [b["with"]["context"] for b in builds]
    assert contexts == [".", "nginx", ".", "nginx"]
    for context in set(contexts):
        assert (ROOT / context / "Dockerfile").is_file()
    order = [s.get("name") for s in steps("image", "image")]
    tests_at = order.index("Container tests")
    loads, pushes = builds[:2], builds[2:]
    for build in loads:
        assert build["with"]["load"] is True
        assert "push" not in build["with"]
        assert order.index(build["name"]) < tests_at
    for build in pushes:
        assert build["with"]["push"] is True
        assert order.index(build["name"]) > tests_at


def test_container_tests_get_the_built_image_names() -> None:
    loaded = workflow("image")
    test_step = step_named("image", "Container tests")
    assert "pytest tests/container" in test_step["run"]
    assert test_step["env"]["SERVING_TEST_IMAGE"] == "${{ env.TEST_IMAGE }}"
    assert test_step["env"]["SERVING_TEST_NGINX_IMAGE"] == "${{ env.TEST_NGINX_IMAGE }}"
    app, nginx = uses("image", "docker/build-push-action", job="image")[:2]
    assert app["with"]["tags"] == "${{ env.TEST_IMAGE }}"
    assert nginx["with"]["tags"] == "${{ env.TEST_NGINX_IMAGE }}"
    assert set(loaded["jobs"]["image"]["env"]) == {"TEST_IMAGE", "TEST_NGINX_IMAGE"}


def build_args(step: dict[str, Any]) -> dict[str, str]:
    lines = step["with"].get("build-args", "").splitlines()
    return dict(line.strip().split("=", 1) for line in lines if line.strip())


def test_one_workflow_variable_names_the_handler_every_app_build_and_test_uses() -> None:
    loaded = workflow("image")
    handler_dir = ROOT / loaded["env"]["HANDLER_DIR"]
    assert (handler_dir / "handler.py").is_file()
    assert (handler_dir / "sample.json").is_file()
    app_builds = [
        b for b in uses("image", "docker/build-push-action") if b["with"]["context"] == "."
    ]
    assert len(app_builds) == 3  # tested, pushed, CUDA
    for build in app_builds:
        assert build_args(build)["HANDLER_DIR"] == "${{ env.HANDLER_DIR }}", build["name"]
        assert build_args(build)["SHARED_DIRS"] == "${{ env.SHARED_DIRS }}", build["name"]
    test_env = step_named("image", "Container tests")["env"]
    assert test_env["SERVING_TEST_HANDLER_DIR"] == "${{ env.HANDLER_DIR }}"
    # Nothing else in the workflow names a handler folder.
    named = [s for s in strings(loaded) if "handlers/" in s]
    assert named == [loaded["env"]["HANDLER_DIR"]]


def test_pull_requests_build_without_logging_in_or_pushing() -> None:
    assert "pull_request" in workflow("image")["on"]
    not_on_prs = "github.event_name != 'pull_request'"
    assert uses("image", "docker/login-action", job="image")[0]["if"] == not_on_prs
    for build in uses("image", "docker/build-push-action", job="image")[2:]:
        assert build["if"] == not_on_prs
        assert "cache-to" in build["with"]
    for build in uses("image", "docker/build-push-action", job="image")[:2]:
        assert "cache-to" not in build["with"]


def test_images_go_to_ghcr_with_sha_branch_semver_and_latest_tags() -> None:
    metas = uses("image", "docker/metadata-action", job="image")
    assert [m["with"]["images"] for m in metas] == [
        "${{ steps.names.outputs.app }}",
        "${{ steps.names.outputs.nginx }}",
    ]
    names = step_named("image", "Image names", job="image")["run"]
    assert 'app="ghcr.io/${GITHUB_REPOSITORY,,}"' in names
    assert 'echo "nginx=${app}-nginx"' in names
    for meta in metas:
        tags = meta["with"]["tags"].split()
        assert "type=sha,format=long" in tags
        assert "type=ref,event=branch" in tags
        assert "type=semver,pattern={{version}}" in tags
        assert "type=raw,value=latest,enable={{is_default_branch}}" in tags
        # latest is the default branch's only, never moved by a tag.
        assert meta["with"]["flavor"] == "latest=false"
    for build in uses("image", "docker/build-push-action"):
        assert build["with"]["cache-from"].startswith("type=registry,ref=")


def pushes(job: str) -> list[dict[str, Any]]:
    return [b for b in uses("image", "docker/build-push-action", job=job) if b["with"].get("push")]


@pytest.mark.parametrize("job", ["image", "image-cuda"])
def test_every_pushed_image_carries_an_sbom_and_max_provenance(job: str) -> None:
    assert pushes(job)
    for build in pushes(job):
        assert build["with"]["sbom"] is True, build["name"]
        assert build["with"]["provenance"] == "mode=max", build["name"]


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


@pytest.mark.parametrize("job", ["image", "image-cuda", "chart"])
def test_every_pushed_digest_gets_a_provenance_attestation_in_the_registry(job: str) -> None:
    attests = uses("image", "actions/attest-build-provenance", job=job)
    # The chart job pushes with `helm push`, in its step `push`.
    pushed = {b["id"] for b in pushes(job)} or {"push"}
    assert {digest_source(job, a)["id"] for a in attests} == pushed
    order = [s.get("name") for s in steps("image", job)]
    for attest in attests:
        source = digest_source(job, attest)
        assert attest["with"]["push-to-registry"] is True
        # Attested exactly when pushed (never on pull requests), after the push.
        assert attest.get("if") == source.get("if")
        assert order.index(source["name"]) < order.index(attest["name"])


def test_the_cpu_images_are_pushed_for_amd64_and_arm64_under_qemu() -> None:
    loaded = workflow("image")
    assert loaded["env"]["PLATFORMS"].split(",") == ["linux/amd64", "linux/arm64"]
    for build in pushes("image"):
        assert build["with"]["platforms"] == "${{ env.PLATFORMS }}", build["name"]
    for build in uses("image", "docker/build-push-action", job="image"):
        if build["with"].get("load"):
            # The runner's own platform, for the container tests.
            assert "platforms" not in build["with"]
    (qemu,) = uses("image", "docker/setup-qemu-action", job="image")
    assert qemu["with"]["platforms"] == "arm64"
    assert qemu["if"] == "github.event_name != 'pull_request'"
    order = [s.get("name") for s in steps("image", "image")]
    assert order.index(qemu["name"]) < order.index("Set up Buildx")
    (cuda,) = pushes("image-cuda")
    assert cuda["with"]["platforms"] == "linux/amd64"


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
            "GITHUB_REPOSITORY_OWNER": "Serving-Core",
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
        "name": "ghcr.io/serving-core/charts/serving-core",
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
    job = workflow("image")["jobs"]["image-cuda"]
    assert evaluate(job["if"], tag_push(ref)) is RELEASE_REFS[ref]


def test_the_cuda_image_is_the_same_handler_with_cu128_torch_tagged_with_a_suffix() -> None:
    loaded = workflow("image")
    job = loaded["jobs"]["image-cuda"]
    # After the CPU image passed its container tests.
    assert job["needs"] == "image"
    assert loaded["env"]["CUDA_VARIANT"] == "cu128"
    (build,) = uses("image", "docker/build-push-action", job="image-cuda")
    args = build_args(build)
    assert args["TORCH_VARIANT"] == "${{ env.CUDA_VARIANT }}"
    assert args["HANDLER_DIR"] == "${{ env.HANDLER_DIR }}"
    assert build["with"]["push"] is True
    assert "cu128" in build["with"]["cache-to"].replace("${{ env.CUDA_VARIANT }}", "cu128")
    (meta,) = uses("image", "docker/metadata-action", job="image-cuda")
    # v1.2.3 -> 1.2.3-cu128 and 1.2-cu128 (what the chart's values-gpu.yaml uses);
    # every tag suffixed, so no CUDA image takes a CPU tag or latest.
    flavor = meta["with"]["flavor"].splitlines()
    assert "suffix=-${{ env.CUDA_VARIANT }}" in flavor
    assert "latest=false" in flavor
    tags = meta["with"]["tags"].split()
    assert "type=semver,pattern={{version}}" in tags
    assert "type=ref,event=branch" not in tags
    gpu_values = (ROOT / "helm" / "serving-core" / "examples" / "values-gpu.yaml").read_text()
    assert re.search(r'tag: "\d+\.\d+\.\d+-cu128"', gpu_values)


@pytest.mark.parametrize("ref", RELEASE_REFS)
def test_the_chart_is_published_on_version_tags_only_after_every_image(ref: str) -> None:
    job = workflow("image")["jobs"]["chart"]
    assert set(job["needs"]) == {"image", "image-cuda"}
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
