"""The chart's pod as containers on this machine, for ``probes.py``: the pod spec Helm
renders for the chart's defaults, the engine's `run` flags that give a container what
that spec gives it, the images it runs, and its cgroup's CPU figures."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml

from tests.container import bases
from tests.container.engine import Engine, Hardening

CHART = Path(__file__).resolve().parent.parent / "helm" / "serving-core"
CHART_TAG = "sha-" + "0" * 40  # the in-repo chart needs a tag; the bench runs its own image


def rendered_pod(cpus: str) -> dict[str, Any]:
    """The chart's Deployment pod spec for its defaults with the CPU limit ``cpus``."""
    import helm_python as helm

    cpu = {"limits": {"cpu": cpus}, "requests": {"cpu": cpus}}
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render({"image": {"tag": CHART_TAG}, "resources": cpu}, name="bench")
    for path, text in manifests.items():
        for doc in yaml.safe_load_all(text) if path.endswith(".yaml") else ():
            if doc and doc.get("kind") == "Deployment":
                spec: dict[str, Any] = doc["spec"]["template"]["spec"]
                return spec
    raise SystemExit("the chart rendered no Deployment")


def run_flags(pod: dict[str, Any], spec: dict[str, Any], socket_dir: Path) -> list[str]:
    """`run` flags that give a container what the pod spec gives ``spec`` (a container)."""
    limits, context = spec["resources"].get("limits", {}), spec["securityContext"]
    mounts = {m["name"]: m["mountPath"] for m in spec["volumeMounts"]}
    hardening = Hardening(
        read_only=context["readOnlyRootFilesystem"],
        tmpfs=tuple(path for name, path in mounts.items() if name != "socket"),  # emptyDirs
        cap_drop=tuple(context["capabilities"]["drop"]),
        security_opt=() if context["allowPrivilegeEscalation"] else ("no-new-privileges:true",),
    )
    user = pod["securityContext"]
    flags = [
        f"--user={user['runAsUser']}:{user['runAsGroup']}",
        f"--volume={socket_dir}:{mounts['socket']}",  # the socket's emptyDir, shared
        *hardening.flags(),
    ]
    if "cpu" in limits:
        cpu = limits["cpu"]
        flags.append(f"--cpus={int(cpu[:-1]) / 1000 if cpu.endswith('m') else float(cpu):g}")
    if "memory" in limits:
        flags.append(f"--memory={limits['memory'].removesuffix('i').lower()}")
    ports = [p["containerPort"] for p in spec.get("ports", [])]
    # Published on 127.0.0.1 only, where this script plays the kubelet; none: the
    # container talks through its socket only, as in the pod.
    flags += [f"--publish=127.0.0.1::{port}" for port in ports] or ["--network=none"]
    return flags + [f"--env={e['name']}={e['value']}" for e in spec["env"] if "value" in e]


def cgroup_cpu_stat(pid: int) -> dict[str, float]:
    """The container's cpu.stat (throttling) and CPU used, in seconds, cgroup v1 or v2."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        names = controllers.split(",")
        if controllers == "" or "cpu" in names:
            found = [Path("/sys/fs/cgroup") / d / path.lstrip("/") for d in ("", *names)]
            found = [p for p in found if (p / "cpu.stat").is_file()]
            if found:
                folder = found[0]
                break
    else:
        raise SystemExit(f"no cpu.stat for pid {pid}")
    stat = dict(line.split() for line in (folder / "cpu.stat").read_text().splitlines())
    if "usage_usec" in stat:  # v2
        used_s, throttled_s = int(stat["usage_usec"]) / 1e6, int(stat["throttled_usec"]) / 1e6
    else:
        acct = Path(str(folder).replace("/cpu/", "/cpuacct/")) / "cpuacct.usage"
        used_s = int(acct.read_text()) / 1e9 if acct.is_file() else float("nan")
        throttled_s = int(stat["throttled_time"]) / 1e9
    return {
        "nr_periods": int(stat["nr_periods"]),
        "nr_throttled": int(stat["nr_throttled"]),
        "throttled_s": throttled_s,
        "cpu_used_s": used_s,
    }


def build_image(
    engine: Engine, context: Path, tag: str, base: bases.Base, args: dict[str, str]
) -> str:
    """``tag`` built from ``context`` on ``base`` (or its stand-in), layers cached."""
    resolved = bases.resolve(engine, base)
    started = time.monotonic()
    engine.build(context, tag, build_args=args, build_contexts=resolved.build_contexts())
    print(f"image {tag} built (or cached) in {time.monotonic() - started:.0f} s", flush=True)
    return tag


def app_bind(app: dict[str, Any]) -> str:
    (bind,) = [e["value"] for e in app["env"] if e["name"] == "SERVING_BIND"]
    return str(bind).removeprefix("unix:")
