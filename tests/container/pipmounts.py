"""This machine's pip settings, lent read-only to podman's builds (which run on
the host network): where PyPI is reached through a proxy with its own CA, or
packages come from local wheel folders and file:// indexes, a build's pip needs
them as the host's pip does. On a machine without pip settings, nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.parse
from pathlib import Path

# Where a build sees this machine's pip files: a folder of its own, so no mount
# hides a file of the image (a CA bundle mounted over the image's own makes
# `apt-get install ca-certificates` fail: "Device or resource busy").
HOST_PIP = "/mnt/host-pip"


def pip_mounts(tmp: Path) -> list[tuple[str, str]]:
    """(host path, container path) pairs that give a build's pip this machine's pip
    settings: its effective configuration (files and PIP_* variables, merged into
    one file mounted as /etc/pip.conf) and the local paths it names (CA bundle,
    constraint files, wheel folders, file:// indexes), under HOST_PIP. None where
    pip has no settings."""
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        env=os.environ,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    ).stdout
    sections: dict[str, dict[str, str]] = {}
    variables: dict[str, str] = {}  # PIP_* (":env:"): over every file's value
    mounts: set[str] = set()
    for line in listing.splitlines():
        key, sep, quoted = line.partition("=")
        section, _, name = key.rpartition(".")
        if not sep or not section:
            continue
        words = []
        for word in quoted.strip().strip("'\"").split():
            path, mount = _local_path(word)
            if path:
                mounts.add(mount)
                scheme = "file://" if word.startswith("file:") else ""
                words.append(f"{scheme}{HOST_PIP}{path}")
            else:
                words.append(word)
        if section == ":env:":
            variables[name] = " ".join(words)
        else:
            sections.setdefault(section, {})[name] = " ".join(words)
    sections.setdefault("global", {}).update(variables)
    if not any(sections.values()):
        return []
    conf = tmp / "pip.conf"
    conf.write_text(
        "".join(
            f"[{section}]\n" + "".join(f"{k} = {v}\n" for k, v in values.items())
            for section, values in sorted(sections.items(), key=lambda s: s[0] != "global")
        )
    )
    return [(str(conf), "/etc/pip.conf")] + [(m, HOST_PIP + m) for m in sorted(mounts)]


def _local_path(word: str) -> tuple[str, str]:
    """A local path a pip setting names, and the folder to mount for it ("" if none)."""
    if word.startswith("file://"):
        path = Path(urllib.parse.urlparse(word).path)
        if path.exists():
            # A local simple index links its files beside it (../../files/...).
            return str(path), str(path.parent if path.name == "simple" else path)
        return "", ""
    if word.startswith("/") and Path(word).exists():
        return word, word
    return "", ""
