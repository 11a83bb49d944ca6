"""deploy.yml: after the images, releases only, no polling; its gate and image
scripts run against sample events, and the kubeconfig stays in its environment."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.deploy.workflows import (
    ROOT,
    evaluate,
    step_named,
    steps,
    uses,
    workflow,
)


def test_deploy_starts_when_the_image_workflow_completes_or_by_hand() -> None:
    loaded = workflow("deploy")
    assert set(loaded["on"]) == {"workflow_run", "workflow_dispatch"}
    run = loaded["on"]["workflow_run"]
    assert run["workflows"] == [workflow("image")["name"]]
    assert run["types"] == ["completed"]
    deploy = loaded["jobs"]["deploy"]
    assert deploy["needs"] == "release"
    assert deploy["if"] == "needs.release.outputs.deploy == 'true'"


IMAGE_RUNS = {
    "a successful tag push": ("success", "push", True),
    "a failed tag push": ("failure", "push", False),
    "a cancelled tag push": ("cancelled", "push", False),
    "a pull request": ("success", "pull_request", False),
}


@pytest.mark.parametrize("run", IMAGE_RUNS)
def test_deploy_considers_only_successful_image_runs_of_pushes(run: str) -> None:
    conclusion, event, considered = IMAGE_RUNS[run]
    condition = workflow("deploy")["jobs"]["release"]["if"]
    github = {
        "event_name": "workflow_run",
        "event": {"workflow_run": {"conclusion": conclusion, "event": event}},
    }
    assert evaluate(condition, {"github": github}) is considered
    assert evaluate(condition, {"github": {"event_name": "workflow_dispatch"}}) is True


def test_deploy_never_polls_or_sleeps() -> None:
    scripts = "\n".join(s.get("run", "") for s in steps("deploy"))
    assert "sleep" not in scripts
    assert not re.search(r"\b(for|while|until)\b.*\bseq\b|\bwhile\b|\buntil\b", scripts)
    assert workflow("deploy")["jobs"]["deploy"]["timeout-minutes"] <= 45


def decide(tmp_path: Path, env: dict[str, str], release: str | None) -> dict[str, str]:
    """Run the deploy gate's script; ``release`` is what `gh release view` prints
    ("isDraft isPrerelease"), None when the tag has no GitHub release."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    gh = fake / "gh"
    if release is None:
        gh.write_text("#!/bin/sh\necho 'release not found' >&2\nexit 1\n")
    else:
        gh.write_text(f"#!/bin/sh\necho '{release}'\n")
    gh.chmod(0o755)
    output = tmp_path / "output"
    output.write_text("")
    script = step_named("deploy", "Is it a release?")["run"]
    result = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        env={
            "PATH": f"{fake}:{os.environ['PATH']}",
            "GITHUB_OUTPUT": str(output),
            "GITHUB_REPOSITORY": "serving-core/serving-core",
            "GITHUB_SHA": "f" * 40,
            "HEAD_SHA": "a" * 40,
            "HEAD_BRANCH": "",
            "INPUT_TAG": "",
            **env,
        },
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return dict(line.split("=", 1) for line in output.read_text().splitlines())


RUN = {"GITHUB_EVENT_NAME": "workflow_run"}
GATE_CASES = {
    "a version tag, no GitHub release": ({**RUN, "HEAD_BRANCH": "v1.2.3"}, None, True),
    "a version tag, a published release": ({**RUN, "HEAD_BRANCH": "v1.2.3"}, "false false", True),
    "a version tag, a pre-release": ({**RUN, "HEAD_BRANCH": "v1.2.3"}, "false true", False),
    "a version tag, a draft": ({**RUN, "HEAD_BRANCH": "v1.2.3"}, "true false", False),
    "a pre-release tag": ({**RUN, "HEAD_BRANCH": "v1.2.3-rc.1"}, "false false", False),
    "a build-metadata tag": ({**RUN, "HEAD_BRANCH": "v1.2.3+build.5"}, None, False),
    "main": ({**RUN, "HEAD_BRANCH": "main"}, None, False),
}


@pytest.mark.parametrize("case", GATE_CASES)
def test_only_releases_that_are_not_pre_releases_deploy(tmp_path: Path, case: str) -> None:
    env, release, deploys = GATE_CASES[case]
    outputs = decide(tmp_path, env, release)
    assert outputs["deploy"] == str(deploys).lower()
    if deploys:
        # The tag's commit, and the tag image.yml pushed for it.
        assert outputs == {"deploy": "true", "ref": "a" * 40, "tag": "1.2.3"}


def test_a_deploy_by_hand_takes_the_typed_tag_or_the_commits(tmp_path: Path) -> None:
    by_hand = {"GITHUB_EVENT_NAME": "workflow_dispatch"}
    assert decide(tmp_path, by_hand, None) == {
        "deploy": "true",
        "ref": "f" * 40,
        "tag": "sha-" + "f" * 40,
    }
    typed = decide(tmp_path, {**by_hand, "INPUT_TAG": "1.2.0"}, None)
    assert typed["tag"] == "1.2.0"


def resolve(tmp_path: Path, tag: str, variant: str) -> dict[str, str]:
    output = tmp_path / "resolved"
    output.write_text("")
    result = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", step_named("deploy", "Resolve the image")["run"]],
        cwd=ROOT,
        env={
            "PATH": os.environ["PATH"],
            "GITHUB_OUTPUT": str(output),
            "GITHUB_REPOSITORY": "Serving-Core/serving-core",
            "VALUES_FILE": "helm/serving-core/examples/values-default.yaml",
            "IMAGE_TAG": tag,
            "VARIANT": variant,
        },
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return dict(line.split("=", 1) for line in output.read_text().splitlines())


def test_deploy_picks_the_app_tag_of_the_variant_and_the_plain_nginx_tag(tmp_path: Path) -> None:
    assert resolve(tmp_path, "1.2.3", "cpu") == {
        "repository": "ghcr.io/serving-core/serving-core",
        "tag": "1.2.3",
        "nginx-tag": "1.2.3",
    }
    cuda = resolve(tmp_path, "1.2.3", "cu128")
    assert (cuda["tag"], cuda["nginx-tag"]) == ("1.2.3-cu128", "1.2.3")


def test_deploy_upgrades_the_tags_commit_with_a_values_file_then_runs_helm_test() -> None:
    loaded = workflow("deploy")
    order = [s.get("name") for s in steps("deploy")]
    assert order.index("Check that the images exist") < order.index("helm upgrade --install")
    assert order.index("helm upgrade --install") < order.index("helm test")
    (checkout,) = uses("deploy", "actions/checkout")
    assert checkout["with"]["ref"] == "${{ needs.release.outputs.ref }}"
    upgrade = step_named("deploy", "helm upgrade --install")["run"]
    assert 'helm upgrade --install "$RELEASE" helm/serving-core' in upgrade
    assert '--values "$VALUES_FILE"' in upgrade
    assert '--set-string image.tag="$TAG"' in upgrade
    assert '--set-string nginx.image.tag="$NGINX_TAG"' in upgrade
    assert "helm test" in step_named("deploy", "helm test")["run"]
    job_env = loaded["jobs"]["deploy"]["env"]
    assert job_env["IMAGE_TAG"] == "${{ needs.release.outputs.tag }}"
    default_values = ROOT / "helm" / "serving-core" / "examples" / "values-default.yaml"
    assert str(default_values.relative_to(ROOT)) in job_env["VALUES_FILE"]


def test_deploy_reads_the_kubeconfig_from_a_secret_and_never_prints_it(tmp_path: Path) -> None:
    write = step_named("deploy", "Write the kubeconfig")
    assert write["env"]["KUBECONFIG_CONTENT"] == "${{ secrets.KUBECONFIG }}"
    assert "secrets." not in "".join(s.get("run", "") for s in steps("deploy"))
    home = tmp_path / "home"
    home.mkdir()
    written = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", write["run"]],
        env={"PATH": os.environ["PATH"], "HOME": str(home), "KUBECONFIG_CONTENT": "apiVersion: v1"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert written.returncode == 0, written.stderr
    assert written.stdout == ""
    config = home / ".kube" / "config"
    # Where helm looks by default, readable by the runner's user only.
    assert config.read_text() == "apiVersion: v1\n"
    assert config.stat().st_mode & 0o077 == 0
    assert "GITHUB_ENV" not in write["run"]
    remove = step_named("deploy", "Remove the kubeconfig")
    assert remove["if"] == "always()"
    assert remove["run"] == 'rm -f "$HOME/.kube/config"'


def test_only_the_deploy_job_sees_the_kubeconfig_and_it_runs_in_an_environment() -> None:
    # An environment's secrets reach only jobs that name it, after its
    # protection rules (reviewers, allowed tags) pass.
    jobs = workflow("deploy")["jobs"]
    assert jobs["deploy"]["environment"] == "production"
    assert "environment" not in jobs["release"]
    readers = [name for name, job in jobs.items() if "secrets.KUBECONFIG" in str(job)]
    assert readers == ["deploy"]
    guide = (ROOT / "docs" / "deployment" / "kubernetes.md").read_text()
    assert "environment `production`" in guide
    for cloud in (
        "aws-actions/configure-aws-credentials",
        "google-github-actions/auth",
        "azure/login",
    ):
        assert cloud in guide
