"""The GitHub Actions workflows: actionlint (with shellcheck) and yamllint pass,
and each workflow does what the README says it does."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
BIN = Path(sys.executable).parent
NAMES = ["ci", "image", "chart", "deploy"]
PINNED = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40} # v\d+(\.\d+){0,2}$")


def workflow(name: str) -> dict[str, Any]:
    loaded: dict[Any, Any] = yaml.safe_load((WORKFLOWS / f"{name}.yml").read_text())
    # YAML 1.1 reads the key `on` as True.
    loaded["on"] = loaded.pop(True, loaded.get("on"))
    return loaded


def steps(name: str) -> list[dict[str, Any]]:
    return [step for job in workflow(name)["jobs"].values() for step in job["steps"]]


def step_named(name: str, step_name: str) -> dict[str, Any]:
    (found,) = [s for s in steps(name) if s.get("name") == step_name]
    return found


def uses(name: str, action: str) -> list[dict[str, Any]]:
    return [s for s in steps(name) if s.get("uses", "").startswith(f"{action}@")]


def uses_lines() -> list[tuple[str, str]]:
    lines = []
    for path in sorted(WORKFLOWS.glob("*.yml")):
        for line in path.read_text().splitlines():
            match = re.match(r"^\s*(?:- )?uses: (.*)$", line)
            if match:
                lines.append((path.name, match.group(1)))
    return lines


def tool(name: str) -> str:
    found = shutil.which(name, path=f"{BIN}:/usr/bin:/usr/local/bin")
    if not found:
        pytest.fail(f"{name} is not installed; `make install-dev system-deps` installs it")
    return found


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)


# --- the linters ----------------------------------------------------------------


def test_actionlint_with_shellcheck_passes() -> None:
    files = [str(p) for p in sorted(WORKFLOWS.glob("*.yml"))]
    result = run(tool("actionlint"), "-shellcheck", tool("shellcheck"), "-no-color", *files)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_reports_shell_and_injection_bugs(tmp_path: Path) -> None:
    # Proof that the check above has teeth: shellcheck runs inside actionlint.
    broken = tmp_path / ".github" / "workflows"
    broken.mkdir(parents=True)
    text = (WORKFLOWS / "ci.yml").read_text()
    bad_step = "run: cd $HOME/${{ github.event.pull_request.title }}"
    (broken / "ci.yml").write_text(text.replace("run: make test", bad_step))
    result = run(
        tool("actionlint"), "-shellcheck", tool("shellcheck"), "-no-color", str(broken / "ci.yml")
    )
    assert result.returncode == 1
    assert "SC2086" in result.stdout
    assert "potentially untrusted" in result.stdout


def test_yamllint_passes() -> None:
    result = run(
        tool("yamllint"),
        "--strict",
        "--config-file",
        ".yamllint.yaml",
        ".github",
        "helm/serving-core",
        ".yamllint.yaml",
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- hardening shared by every workflow -----------------------------------------


def test_the_four_workflows_exist() -> None:
    assert sorted(p.stem for p in WORKFLOWS.glob("*.yml")) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_nothing_is_granted_by_default_and_each_job_asks_for_its_own(name: str) -> None:
    loaded = workflow(name)
    assert loaded["permissions"] == {}
    for job_name, job in loaded["jobs"].items():
        assert isinstance(job.get("permissions"), dict), f"{name}.yml job {job_name}"
        assert job["permissions"].get("contents") == "read"
        writes = {k for k, v in job["permissions"].items() if v == "write"}
        assert writes <= {"packages"}, f"{name}.yml job {job_name} writes {writes}"


def test_only_publishing_jobs_may_write_packages() -> None:
    writers = {
        (name, job_name)
        for name in NAMES
        for job_name, job in workflow(name)["jobs"].items()
        if job["permissions"].get("packages") == "write"
    }
    assert writers == {("image", "image"), ("chart", "publish")}


@pytest.mark.parametrize("name", NAMES)
def test_concurrency_is_set_and_superseded_runs_are_cancelled(name: str) -> None:
    concurrency = workflow(name)["concurrency"]
    assert "github.workflow" in concurrency["group"]
    # A deploy is never cut off mid-upgrade: Helm would leave the release locked.
    assert concurrency["cancel-in-progress"] is (name != "deploy")


def test_actions_are_pinned_by_full_commit_sha_with_a_version_comment() -> None:
    lines = uses_lines()
    assert len(lines) >= 10
    for file, line in lines:
        assert PINNED.match(line), f"{file}: uses: {line}"


def test_each_action_is_pinned_to_one_sha_everywhere() -> None:
    shas: dict[str, set[str]] = {}
    for _, line in uses_lines():
        action, _, rest = line.partition("@")
        shas.setdefault(action, set()).add(rest)
    assert {a: s for a, s in shas.items() if len(s) > 1} == {}


@pytest.mark.parametrize("name", NAMES)
def test_checkout_does_not_keep_the_token_on_disk(name: str) -> None:
    checkouts = uses(name, "actions/checkout")
    assert checkouts
    for step in checkouts:
        assert step["with"]["persist-credentials"] is False


# --- what each workflow does -----------------------------------------------------


def test_ci_runs_make_test_on_pushes_and_pull_requests() -> None:
    loaded = workflow("ci")
    assert {"push", "pull_request"} <= set(loaded["on"])
    assert [s["run"] for s in steps("ci") if "run" in s] == ["make test"]
    assert re.search(r"^test:", (ROOT / "Makefile").read_text(), re.MULTILINE)


def test_image_builds_both_dockerfiles_and_tests_them_before_pushing() -> None:
    builds = uses("image", "docker/build-push-action")
    contexts = [b["with"]["context"] for b in builds]
    assert contexts == [".", "nginx", ".", "nginx"]
    for context in set(contexts):
        assert (ROOT / context / "Dockerfile").is_file()
    order = [s.get("name") for s in steps("image")]
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
    app, nginx = uses("image", "docker/build-push-action")[:2]
    assert app["with"]["tags"] == "${{ env.TEST_IMAGE }}"
    assert nginx["with"]["tags"] == "${{ env.TEST_NGINX_IMAGE }}"
    assert set(loaded["jobs"]["image"]["env"]) == {"TEST_IMAGE", "TEST_NGINX_IMAGE"}


def test_pull_requests_build_without_logging_in_or_pushing() -> None:
    assert "pull_request" in workflow("image")["on"]
    not_on_prs = "github.event_name != 'pull_request'"
    assert uses("image", "docker/login-action")[0]["if"] == not_on_prs
    for build in uses("image", "docker/build-push-action")[2:]:
        assert build["if"] == not_on_prs
        assert "cache-to" in build["with"]
    for build in uses("image", "docker/build-push-action")[:2]:
        assert "cache-to" not in build["with"]


def test_images_go_to_ghcr_with_sha_branch_semver_and_latest_tags() -> None:
    metas = uses("image", "docker/metadata-action")
    assert [m["with"]["images"] for m in metas] == [
        "${{ steps.names.outputs.app }}",
        "${{ steps.names.outputs.nginx }}",
    ]
    names = step_named("image", "Image names")["run"]
    assert 'app="ghcr.io/${GITHUB_REPOSITORY,,}"' in names
    assert 'echo "nginx=${app}-nginx"' in names
    for meta in metas:
        tags = meta["with"]["tags"].split()
        assert "type=sha,format=long" in tags
        assert "type=ref,event=branch" in tags
        assert "type=semver,pattern={{version}}" in tags
        assert "type=raw,value=latest,enable={{is_default_branch}}" in tags
    for build in uses("image", "docker/build-push-action"):
        assert build["with"]["cache-from"].startswith("type=registry,ref=")


def test_chart_is_packaged_with_the_image_tag_as_app_version_and_pushed_on_tags() -> None:
    loaded = workflow("chart")
    assert loaded["on"]["push"]["tags"] == workflow("image")["on"]["push"]["tags"]
    publish = loaded["jobs"]["publish"]
    assert publish["if"] == "startsWith(github.ref, 'refs/tags/v')"
    assert publish["needs"] == "lint"
    package = step_named("chart", "Package")["run"]
    # image.yml tags v1.2.3's images 1.2.3 (type=semver,pattern={{version}}).
    assert 'version="${GITHUB_REF_NAME#v}"' in package
    assert '--version "$version" --app-version "$version"' in package
    push = step_named("chart", "Push")["run"]
    assert "helm registry login ghcr.io" in push
    assert 'helm push "$ARCHIVE" "oci://ghcr.io/' in push


def test_chart_lint_covers_every_example() -> None:
    lint = step_named("chart", "helm lint --strict, helm template every example")["run"]
    assert 'for values in "$CHART_DIR"/examples/values-*.yaml' in lint
    assert 'helm lint --strict "$CHART_DIR" --values "$values"' in lint
    assert workflow("chart")["env"]["CHART_DIR"] == "helm/serving-core"
    assert (ROOT / "helm" / "serving-core" / "Chart.yaml").is_file()


def test_deploy_upgrades_with_a_values_file_and_the_built_tag_then_runs_helm_test() -> None:
    loaded = workflow("deploy")
    assert set(loaded["on"]) == {"release", "workflow_dispatch"}
    order = [s.get("name") for s in steps("deploy")]
    assert order.index("helm upgrade --install") < order.index("helm test")
    upgrade = step_named("deploy", "helm upgrade --install")["run"]
    assert 'helm upgrade --install "$RELEASE" helm/serving-core' in upgrade
    assert '--values "$VALUES_FILE"' in upgrade
    assert '--set-string image.tag="$TAG"' in upgrade
    resolve = step_named("deploy", "Resolve the image")["run"]
    # The tags image.yml pushes: 1.2.3 for v1.2.3, sha-<full sha> for any commit.
    assert 'IMAGE_TAG="${GITHUB_REF_NAME#v}"' in resolve
    assert 'IMAGE_TAG="sha-${GITHUB_SHA}"' in resolve
    assert "helm test" in step_named("deploy", "helm test")["run"]
    default_values = ROOT / "helm" / "serving-core" / "examples" / "values-default.yaml"
    assert str(default_values.relative_to(ROOT)) in loaded["jobs"]["deploy"]["env"]["VALUES_FILE"]


def test_deploy_reads_the_kubeconfig_from_a_secret_and_never_prints_it() -> None:
    write = step_named("deploy", "Write the kubeconfig")
    assert write["env"]["KUBECONFIG_CONTENT"] == "${{ secrets.KUBECONFIG }}"
    assert "umask 077" in write["run"]
    assert "KUBECONFIG=$kubeconfig" in write["run"]
    assert "secrets." not in "".join(s.get("run", "") for s in steps("deploy"))
