"""The GitHub Actions workflows: zizmor, actionlint (with shellcheck), yamllint and
the workflow, action, Dependabot and compose schemas pass, and each workflow does
what docs/deployment/kubernetes.md says it does. zizmor owns the hardening rules it
knows (pinned actions, credentials left on disk, injection, dangerous triggers,
cache poisoning); the asserts here are the ones it does not make. Conditions
(`if:`) are evaluated against sample events and the deploy gate's script is run,
so the tests show behaviour, not only text."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
GITHUB = ROOT / ".github"
WORKFLOWS = GITHUB / "workflows"
SETUP_HELM = GITHUB / "actions" / "setup-helm"
BIN = Path(sys.executable).parent
NAMES = ["ci", "image", "chart", "deploy"]
PINNED = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40} # v\d+(\.\d+){0,2}$")


def workflow(name: str) -> dict[str, Any]:
    loaded: dict[Any, Any] = yaml.safe_load((WORKFLOWS / f"{name}.yml").read_text())
    # YAML 1.1 reads the key `on` as True.
    loaded["on"] = loaded.pop(True, loaded.get("on"))
    return loaded


def steps(name: str, job: str | None = None) -> list[dict[str, Any]]:
    jobs = workflow(name)["jobs"]
    chosen = [jobs[job]] if job else list(jobs.values())
    return [step for each in chosen for step in each["steps"]]


def step_named(name: str, step_name: str, job: str | None = None) -> dict[str, Any]:
    (found,) = [s for s in steps(name, job) if s.get("name") == step_name]
    return found


def strings(value: Any) -> list[str]:
    """Every string in a loaded workflow (keys and values), comments left out."""
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in strings(k) + strings(v)]
    if isinstance(value, list):
        return [s for item in value for s in strings(item)]
    return [value] if isinstance(value, str) else []


def uses(name: str, action: str, job: str | None = None) -> list[dict[str, Any]]:
    return [s for s in steps(name, job) if s.get("uses", "").startswith(f"{action}@")]


def evaluate(expression: str, context: Mapping[str, Any]) -> Any:
    """An Actions `if:` expression evaluated over ``context`` (github, needs, ...).

    Covers what these workflows use: contexts, 'strings', ==, !=, !, &&, ||,
    parentheses and startsWith (case-insensitive, as in Actions). A missing
    property is null, as in Actions."""

    def get(path: str) -> Any:
        value: Any = context
        for key in path.split("."):
            value = value.get(key) if isinstance(value, Mapping) else None
        return value

    def starts_with(text: Any, prefix: Any) -> bool:
        return str(text or "").lower().startswith(str(prefix or "").lower())

    token = re.compile(
        r"'(?:[^']|'')*'|(?:github|needs|inputs|vars|env)(?:\.[\w-]+)+|&&|\|\||!(?!=)"
        r"|startsWith|[()=,\s]+|!=|\S"
    )
    python = []
    for match in token.finditer(expression.strip().removeprefix("${{").removesuffix("}}")):
        part = match.group(0)
        if part.startswith("'"):
            python.append(repr(part[1:-1].replace("''", "'")))
        elif re.match(r"^(github|needs|inputs|vars|env)\.", part):
            python.append(f"get({part!r})")
        else:
            python.append(
                {"&&": " and ", "||": " or ", "!": " not ", "startsWith": "starts_with"}.get(
                    part, part
                )
            )
    return eval("".join(python), {"__builtins__": {}}, {"get": get, "starts_with": starts_with})


def uses_lines() -> list[tuple[str, str]]:
    """Every remote action reference, in the workflows and the local actions."""
    lines = []
    for path in sorted([*WORKFLOWS.glob("*.yml"), *GITHUB.glob("actions/*/action.yml")]):
        for line in path.read_text().splitlines():
            match = re.match(r"^\s*(?:- )?uses: (.*)$", line)
            if match and not match.group(1).startswith("./"):
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
    "vendor.compose-spec": [ROOT / "docker-compose.yml"],
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
    assert writers == {("image", "image"), ("image", "image-cuda"), ("image", "chart")}


@pytest.mark.parametrize("name", NAMES)
def test_concurrency_is_set_and_superseded_runs_are_cancelled(name: str) -> None:
    concurrency = workflow(name)["concurrency"]
    assert "github.workflow" in concurrency["group"]
    # A deploy is never cut off mid-upgrade: Helm would leave the release locked.
    assert concurrency["cancel-in-progress"] is (name != "deploy")


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


# --- what each workflow does -----------------------------------------------------


def test_ci_runs_make_test_on_pushes_and_pull_requests() -> None:
    loaded = workflow("ci")
    assert {"push", "pull_request"} <= set(loaded["on"])
    assert [s["run"] for s in steps("ci") if "run" in s] == ["make test"]
    assert re.search(r"^test:", (ROOT / "Makefile").read_text(), re.MULTILINE)


PULL_REQUEST_FROM = {
    "the same repository": ("serving-core/serving-core", False),
    "a fork": ("someone/serving-core", True),
}


@pytest.mark.parametrize("origin", PULL_REQUEST_FROM)
def test_ci_runs_once_per_commit_pull_requests_only_from_forks(origin: str) -> None:
    # A same-repo pull request's branch push already runs CI on that commit.
    head_repo, runs = PULL_REQUEST_FROM[origin]
    condition = workflow("ci")["jobs"]["test"]["if"]
    repo = "serving-core/serving-core"
    pull_request = {
        "event_name": "pull_request",
        "repository": repo,
        "event": {"pull_request": {"head": {"repo": {"full_name": head_repo}}}},
    }
    assert evaluate(condition, {"github": pull_request}) is runs
    assert evaluate(condition, {"github": {"event_name": "push", "repository": repo}}) is True
    assert workflow("ci")["on"]["push"]["branches"] == ["**"]


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


# --- deploy: after the images, releases only, no polling -------------------------


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
