"""Where serving-core keeps its own files by default: a directory only its user may open.

``$TMPDIR/serving-core-UID`` (``/tmp`` without ``TMPDIR``), made mode 0700 by
the SQLite queue, which refuses one another user made first (``jobs.sqlite.file``).
Why there: it must be writable wherever serving-core runs, the image included
(a read-only root filesystem, ``HOME=/nonexistent``, and ``/tmp`` an emptyDir
in the chart), and the same for ``serve`` and ``worker`` started by one user.
``$XDG_RUNTIME_DIR`` is unset in containers and is removed at logout; the XDG
state directory needs a home. ``/tmp`` itself is often a tmpfs, so a queue
that must outlive a reboot sets ``SERVING_JOBS_PATH`` on a disk
(docs/guarantees.md).
"""

from __future__ import annotations

import os


def private_directory(tmpdir: str = "/tmp") -> str:
    """This user's serving-core directory under ``tmpdir``."""
    return os.path.join(tmpdir, f"serving-core-{os.getuid()}")


def default_jobs_path(tmpdir: str = "/tmp") -> str:
    return os.path.join(private_directory(tmpdir), "jobs.db")


def default_model_cache(tmpdir: str = "/tmp") -> str:
    return os.path.join(private_directory(tmpdir), "models")
