"""The GitHub Actions workflows as a whole: zizmor, actionlint (with shellcheck),
yamllint and the workflow, action, Dependabot and compose schemas pass; the
hardening zizmor does not check (permissions policy, concurrency, version
comments); ci.yml; the one Helm version. zizmor owns the rules it knows (pinned
actions, credentials left on disk, injection, dangerous triggers, cache
poisoning). image.yml and chart.yml are in test_image_workflow.py, deploy.yml in
test_deploy_workflow.py; docs/deployment/kubernetes.md says what each does."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.workflows import (
    GITHUB,
    NAMES,
    ROOT,
    SETUP_HELM,
    WORKFLOWS,
    evaluate,
    run,
    step_named,
    steps,
    tool,
    uses_lines,
    workflow,
)

PINNED = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40} # v\d+(\.\d+){0,2}$")


# --- the linters ----------------------------------------------------------------


def zizmor(path: Path) -> subprocess.CompletedProcess[str]:
    # --offline: no GitHub API here (the audits that need it, such as known
    # vulnerable action versions, are left out); nothing above "low" may remain.
    return run(tool("zizmor"), "--offline", "--no-progress", "--min-severity", "medium", str(path))


def test_zizmor_finds_nothing_above_low() -> None:
    result = zizmor(GITHUB)
    assert result.returncode == 0, result.stdout + result.stderr


def test_zizmor_reports_unpinned_actions_kept_credentials_and_injection(tmp_path: Path) -> None:
    # Proof that the check above has teeth, on ci.yml made unsafe three ways.
    broken = tmp_path / ".github" / "workflows"
    broken.mkdir(parents=True)
    text = (WORKFLOWS / "ci.yml").read_text()
    checkout = re.search(r"actions/checkout@\S+ # \S+", text)
    assert checkout
    text = text.replace(checkout.group(0), "actions/checkout@v5")
    text = text.replace("          persist-credentials: false\n", "          fetch-depth: 1\n")
    text = text.replace("run: make test", "run: echo ${{ github.event.pull_request.title }}")
    (broken / "ci.yml").write_text(text)
    result = zizmor(tmp_path / ".github")
    assert result.returncode != 0
    for audit in ("unpinned-uses", "artipacked", "template-injection"):
        assert f"[{audit}]" in result.stdout, result.stdout


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


SCHEMAS = {
    "vendor.github-workflows": sorted(WORKFLOWS.glob("*.yml")),
    "vendor.github-actions": sorted(GITHUB.glob("actions/*/action.yml")),
    "vendor.dependabot": [GITHUB / "dependabot.yml"],
    "vendor.compose-spec": [
        ROOT / "docker-compose.yml",
        ROOT / "compose.gpu.yml",
        ROOT / "compose.model.yml",
        ROOT / "compose.tracing.yml",
    ],
}


@pytest.mark.parametrize("schema", SCHEMAS)
def test_files_match_their_schemastore_schema(schema: str) -> None:
    files = SCHEMAS[schema]
    assert files
    assert all(f.is_file() for f in files)
    result = run(tool("check-jsonschema"), "--builtin-schema", schema, *map(str, files))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_dependabot_schema_rejects_an_unknown_ecosystem(tmp_path: Path) -> None:
    config = tmp_path / "dependabot.yml"
    text = (GITHUB / "dependabot.yml").read_text()
    config.write_text(text.replace("package-ecosystem: pip", "package-ecosystem: pipx"))
    result = run(tool("check-jsonschema"), "--builtin-schema", "vendor.dependabot", str(config))
    assert result.returncode == 1, result.stdout


def test_dependabot_watches_every_lockfile_of_the_chart_tools() -> None:
    # The npm tools (readme-generator-for-helm, tools/chart-docs) are pinned by a
    # lockfile that nothing else would bump.
    updates = yaml.safe_load((GITHUB / "dependabot.yml").read_text())["updates"]
    watched = {
        (entry["package-ecosystem"], folder)
        for entry in updates
        for folder in entry.get("directories", [entry.get("directory")])
    }
    root = GITHUB.parent
    for lockfile in root.glob("tools/*/package-lock.json"):
        assert ("npm", "/" + str(lockfile.parent.relative_to(root))) in watched, lockfile
    assert list(root.glob("tools/*/package-lock.json"))


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
        assert writes <= PUBLISHING, f"{name}.yml job {job_name} writes {writes}"


# What a job that publishes needs: push to GHCR, and sign (OIDC) and store the
# provenance attestations of what it pushed.
PUBLISHING = {"packages", "id-token", "attestations"}


@pytest.mark.parametrize("grant", sorted(PUBLISHING))
def test_only_publishing_jobs_may_push_or_sign(grant: str) -> None:
    writers = {
        (name, job_name)
        for name in NAMES
        for job_name, job in workflow(name)["jobs"].items()
        if job["permissions"].get(grant) == "write"
    }
    publishers = {("image", "push"), ("image", "chart")}
    # The image job writes the tested layers to the registry cache, and signs nothing.
    assert writers == publishers | ({("image", "image")} if grant == "packages" else set())


@pytest.mark.parametrize("name", NAMES)
def test_concurrency_is_set_and_superseded_runs_are_cancelled(name: str) -> None:
    concurrency = workflow(name)["concurrency"]
    assert "github.workflow" in concurrency["group"]
    # A deploy is never cut off mid-upgrade: Helm would leave the release locked. A
    # publishing run (image.yml on main or a tag) is cut off only for a pull request:
    # halfway, some images would be pushed and others not.
    expected = {"deploy": False, "image": "${{ github.event_name == 'pull_request' }}"}
    assert concurrency["cancel-in-progress"] == expected.get(name, True)


def test_each_pin_carries_the_version_comment_dependabot_updates() -> None:
    # zizmor checks that every action is pinned by SHA; the `# vX.Y.Z` comment is
    # what a reader and Dependabot's pull requests go by.
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


# --- ci.yml ---------------------------------------------------------------------


def test_ci_runs_the_users_check_and_the_frameworks_suite() -> None:
    loaded = workflow("ci")
    assert {"push", "pull_request", "schedule"} <= set(loaded["on"])
    assert [s["run"] for s in steps("ci", "check") if "run" in s] == ["make check"]
    assert [s["run"] for s in steps("ci", "test") if "run" in s] == ["make test"]
    makefile = (ROOT / "Makefile").read_text()
    for target in ("check", "test", "contracts"):
        assert re.search(rf"^{target}:", makefile, re.MULTILINE), target


def test_the_framework_suite_runs_nightly() -> None:
    (nightly,) = workflow("ci")["on"]["schedule"]
    every = nightly["cron"].split()[2:]
    assert every == ["*", "*", "*"], nightly
    changes = {"changes": {"outputs": {"framework": "true"}}}
    assert evaluate(workflow("ci")["jobs"]["test"]["if"], {"needs": changes}) is True


PULL_REQUEST_FROM = {
    "the same repository": ("serving-core/serving-core", False),
    "a fork": ("someone/serving-core", True),
}


@pytest.mark.parametrize("job", ["changes", "check"])
@pytest.mark.parametrize("origin", PULL_REQUEST_FROM)
def test_ci_runs_once_per_commit_pull_requests_only_from_forks(origin: str, job: str) -> None:
    # A same-repo pull request's branch push already runs CI on that commit.
    head_repo, runs = PULL_REQUEST_FROM[origin]
    condition = workflow("ci")["jobs"][job]["if"]
    repo = "serving-core/serving-core"
    pull_request = {
        "event_name": "pull_request",
        "repository": repo,
        "event": {"pull_request": {"head": {"repo": {"full_name": head_repo}}}},
    }
    assert evaluate(condition, {"github": pull_request}) is runs
    for event in ("push", "schedule"):
        assert evaluate(condition, {"github": {"event_name": event, "repository": repo}}) is True
    assert workflow("ci")["on"]["push"]["branches"] == ["**"]
    # The framework's suite waits on `changes`, so it is skipped with it.
    assert workflow("ci")["jobs"]["test"]["needs"] == "changes"


# --- ci.yml: which suites a push runs -------------------------------------------


def changes_says(repo: Path, since: str) -> str:
    """The output of ci.yml's "Did the framework change" step, run for real in ``repo``."""
    step = step_named("ci", "Did the framework change", "changes")
    output = repo / "github_output"
    output.write_text("")
    env = {key: str(value).strip() for key, value in step["env"].items() if "${{" not in value}
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", step["run"]],
        cwd=repo,
        env={"PATH": os.environ["PATH"], "SINCE": since, "GITHUB_OUTPUT": str(output), **env},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = output.read_text().splitlines()
    return line


def commit(repo: Path, *files: str) -> str:
    for name in files:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(
            f"{name}, changed\n" + (repo / name).read_text()
            if (repo / name).exists()
            else f"{name}\n"
        )
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "c"], cwd=repo, check=True)
    done = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


# What a push changed -> whether the framework's suite runs.
PUSHES = {
    "a handler alone": (["handlers/sentiment/handler.py", "handlers/sentiment/sample.json"], False),
    "a handler and the README": (["handlers/sentiment/handler.py", "README.md"], False),
    "the package": (["serving_core/web/app.py"], True),
    "a test": (["tests/web/test_app.py"], True),
    "the app's Dockerfile": (["Dockerfile"], True),
    "nginx": (["nginx/templates/default.conf.template"], True),
    "the chart": (["helm/serving-core/values.yaml"], True),
    "a workflow": ([".github/workflows/image.yml"], True),
    "the constraints": (["constraints.txt"], True),
    "a handler and the package": (["handlers/sentiment/handler.py", "serving_core/x.py"], True),
}


@pytest.mark.parametrize("push", PUSHES)
def test_only_a_change_to_the_framework_runs_its_suite(tmp_path: Path, push: str) -> None:
    files, framework = PUSHES[push]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=tmp_path, check=True)
    before = commit(tmp_path, "handlers/sentiment/handler.py", "serving_core/x.py", "README.md")
    commit(tmp_path, *files)
    assert changes_says(tmp_path, before) == f"framework={str(framework).lower()}"
    changes = {"changes": {"outputs": {"framework": str(framework).lower()}}}
    assert evaluate(workflow("ci")["jobs"]["test"]["if"], {"needs": changes}) is framework
    # The user's check has no such condition: it runs on every push.
    assert "changes" not in str(workflow("ci")["jobs"]["check"].get("needs", ""))


@pytest.mark.parametrize(
    "since",
    ["", "0" * 40, "1234567890abcdef1234567890abcdef12345678"],
    ids=["schedule", "new-branch", "gone"],
)
def test_everything_runs_where_the_start_is_unknown(tmp_path: Path, since: str) -> None:
    # A schedule has no `before`, a new branch's is all zeros, a force push's may be gone.
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=tmp_path, check=True)
    commit(tmp_path, "handlers/sentiment/handler.py")
    assert changes_says(tmp_path, since) == "framework=true"


# --- one Helm version -----------------------------------------------------------


def helm_version_step() -> dict[str, Any]:
    action = yaml.safe_load((SETUP_HELM / "action.yml").read_text())
    (read,) = [s for s in action["runs"]["steps"] if s.get("id") == "version"]
    return read


def read_helm_version(tmp_path: Path, dockerfile: str) -> subprocess.CompletedProcess[str]:
    action = tmp_path / "setup-helm"
    action.mkdir(exist_ok=True)
    (action / "Dockerfile").write_text(dockerfile)
    output = tmp_path / "output"
    output.write_text("")
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", helm_version_step()["run"]],
        env={
            "PATH": os.environ["PATH"],
            "GITHUB_ACTION_PATH": str(action),
            "GITHUB_OUTPUT": str(output),
        },
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_helm_version_is_the_tag_in_the_one_dockerfile_dependabot_bumps(
    tmp_path: Path,
) -> None:
    dockerfile = (SETUP_HELM / "Dockerfile").read_text()
    (tag,) = re.findall(r"(?m)^FROM alpine/helm:(\d+\.\d+\.\d+)$", dockerfile)
    result = read_helm_version(tmp_path, dockerfile)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "output").read_text() == f"version=v{tag}\n"
    dependabot = yaml.safe_load((GITHUB / "dependabot.yml").read_text())
    docker = [u for u in dependabot["updates"] if u["package-ecosystem"] == "docker"]
    assert any("/.github/actions/setup-helm" in u["directories"] for u in docker)


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "nginx/Dockerfile"])
def test_dependabot_reads_the_base_image_of_each_dockerfile(dockerfile: str) -> None:
    # Dependabot's docker ecosystem reads `FROM image:tag` in the folders it is
    # given, never an ARG default (`FROM ${IMAGE}`, dependabot-core#2057).
    froms = re.findall(r"(?m)^FROM\s+(\S+)", (ROOT / dockerfile).read_text())
    assert froms
    for image in froms:
        assert "$" not in image, f"{dockerfile}: FROM {image} is hidden from Dependabot"
        assert re.fullmatch(r"[\w./-]+:[\w.-]+", image), f"{dockerfile}: FROM {image} has no tag"
    dependabot = yaml.safe_load((GITHUB / "dependabot.yml").read_text())
    docker = [u for u in dependabot["updates"] if u["package-ecosystem"] == "docker"]
    folder = "/" + str(Path(dockerfile).parent).removeprefix(".")
    assert any(folder in u["directories"] for u in docker), folder


def test_a_dockerfile_without_a_helm_tag_stops_the_setup(tmp_path: Path) -> None:
    result = read_helm_version(tmp_path, "FROM alpine/helm:latest\n")
    assert result.returncode == 1
    assert "FROM alpine/helm:X.Y.Z" in result.stdout


@pytest.mark.parametrize("name", ["chart", "image", "deploy"])
def test_every_workflow_that_runs_helm_sets_it_up_through_the_one_action(name: str) -> None:
    text = (WORKFLOWS / f"{name}.yml").read_text()
    assert "helm " in text
    setups = [s for s in steps(name) if s.get("uses") == "./.github/actions/setup-helm"]
    assert setups
    assert "azure/setup-helm" not in text
    (version,) = re.findall(r"alpine/helm:(\S+)", (SETUP_HELM / "Dockerfile").read_text())
    assert "HELM_VERSION" not in text
    assert version not in text


def test_dependabot_watches_the_images_compose_pulls_each_pinned_to_a_version() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    pulled = {name: spec["image"] for name, spec in services.items() if "build" not in spec}
    assert pulled
    for name, image in pulled.items():
        # A version Dependabot can move (MAJOR.MINOR.PATCH, then the image's variant),
        # not a floating tag such as redis:7-alpine that changes under the same name.
        assert re.fullmatch(r"[\w./-]+:\d+\.\d+\.\d+(-[\w.-]+)?", image), f"{name}: {image}"
    dependabot = yaml.safe_load((GITHUB / "dependabot.yml").read_text())
    compose = [u for u in dependabot["updates"] if u["package-ecosystem"] == "docker-compose"]
    assert any("/" in [u.get("directory"), *u.get("directories", [])] for u in compose)
