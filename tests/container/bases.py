"""The base images the Dockerfiles build FROM, found or made.

For each base (the image a Dockerfile's FROM lines name, literally, so that
Dependabot reads it): the image itself when the engine's store has it, else the
image pulled (one try, bounded), else a stand-in built here from Debian
packages and kept in the store for the next run: ``debootstrap
--variant=minbase bookworm`` imported as
``localhost/serving-core-standin/debian:bookworm``, then the base's
Containerfile in tests/container/standins/ built on top (a layer-cache hit once
built). A stand-in replaces the base by name, ``--build-context
NAME=docker-image://STAND-IN``, which both engines apply to every FROM that
names it (BuildKit's named contexts; buildah's since podman 4.3). Each answer
says which image it is and why, for the test report.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.container.engine import Engine, EngineError

ROOT = Path(__file__).resolve().parents[2]
STANDINS = Path(__file__).resolve().parent / "standins"
STANDIN_REPOSITORY = "localhost/serving-core-standin"
DEBIAN_IMAGE = f"{STANDIN_REPOSITORY}/debian:bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
PULL_TIMEOUT_S = 60.0
DEBOOTSTRAP_TIMEOUT_S = 900.0
# What the official debian:bookworm image sets, which an imported tarball lacks.
DEBIAN_CONFIG = [
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    'CMD ["bash"]',
]


def from_images(dockerfile: Path) -> list[str]:
    """The images the Dockerfile's FROM lines name, in order (stage names left out)."""
    stages: set[str] = set()
    images = []
    for line in dockerfile.read_text().splitlines():
        found = re.match(r"^FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?\s*$", line, re.I)
        if found is None:
            continue
        if found.group(1) not in stages:
            images.append(found.group(1))
        if found.group(2):
            stages.add(found.group(2))
    return images


@dataclass(frozen=True)
class Base:
    """The base image a Dockerfile names, and the stand-in's Containerfile."""

    dockerfile: Path
    standin: Path

    @property
    def name(self) -> str:
        """The image every FROM of the Dockerfile names, as written there."""
        names = sorted(set(from_images(self.dockerfile)))
        if len(names) != 1:
            raise ValueError(
                f"{self.dockerfile} names {names or 'no image'} in its FROM lines; the "
                "container tests expect one base image, named literally (`FROM image:tag`)"
            )
        return names[0]


PYTHON = Base(ROOT / "Dockerfile", STANDINS / "python.Containerfile")
NGINX = Base(ROOT / "nginx" / "Dockerfile", STANDINS / "nginx.Containerfile")


@dataclass(frozen=True)
class Resolved:
    base: Base
    image: str  # the image the build uses for the base
    why: str

    def build_contexts(self) -> dict[str, str]:
        """What replaces the base in a build: nothing when it is the image the
        Dockerfile names, else the stand-in, by name."""
        if self.image == qualified(self.base.name):
            return {}
        return {self.base.name: f"docker-image://{self.image}"}

    def describe(self) -> str:
        return f"{self.base.name} -> {self.image} ({self.why})"


def qualified(image: str) -> str:
    """The full name Docker reads a short one as (podman refuses to guess a registry)."""
    first, slash, _ = image.partition("/")
    if not slash:
        return f"docker.io/library/{image}"
    if "." in first or ":" in first or first == "localhost":
        return image
    return f"docker.io/{image}"


def resolve(engine: Engine, base: Base) -> Resolved:
    wanted = qualified(base.name)
    if engine.image_exists(wanted):
        return Resolved(base, wanted, "in the engine's image store")
    failed = engine.pull(wanted, PULL_TIMEOUT_S)
    if not failed:
        return Resolved(base, wanted, "pulled")
    standin = f"{STANDIN_REPOSITORY}/{wanted.rpartition('/')[2]}"
    if not base.standin.is_file():
        raise EngineError(
            f"{wanted} is not in the image store and the pull failed ({failed}), and there "
            f"is no stand-in to build ({base.standin} is missing): pull or load {wanted}"
        )
    debian = debian_image(engine)
    engine.build(STANDINS, standin, containerfile=base.standin, build_args={"DEBIAN_IMAGE": debian})
    why = (
        f"a stand-in for {wanted}, built from Debian bookworm packages by "
        f"{base.standin.relative_to(ROOT)}: the pull failed: {failed}"
    )
    return Resolved(base, standin, why)


def debian_image(engine: Engine) -> str:
    """localhost/serving-core-standin/debian:bookworm, debootstrapped the first time."""
    if engine.image_exists(DEBIAN_IMAGE):
        return DEBIAN_IMAGE
    debootstrap = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
    if not Path(debootstrap).exists():
        raise EngineError(f"building {DEBIAN_IMAGE} needs debootstrap: run `make system-deps`")
    if os.geteuid() != 0:
        raise EngineError(
            f"building {DEBIAN_IMAGE} with debootstrap needs root: run the tests as root "
            "once, or make the Dockerfiles' base images available to the engine (pull or load)"
        )
    with tempfile.TemporaryDirectory(prefix="serving-debootstrap-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        result = subprocess.run(
            [debootstrap, "--variant=minbase", "bookworm", str(rootfs), DEBIAN_MIRROR],
            capture_output=True,
            text=True,
            check=False,
            timeout=DEBOOTSTRAP_TIMEOUT_S,
        )
        if result.returncode != 0:
            raise EngineError(
                f"debootstrap of bookworm from {DEBIAN_MIRROR} failed:\n{result.stdout[-4000:]}"
            )
        engine.import_rootfs(rootfs, DEBIAN_IMAGE, DEBIAN_CONFIG)
    return DEBIAN_IMAGE
