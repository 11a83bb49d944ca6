"""The gevent worker's patching (``process.workers.patching``): names bound to ``ssl``'s
blocking classes before the patch (urllib3's ``SSLContext``, imported by the master
for a pipeline's stages) are gevent's afterwards, and gevent's MonkeyPatchWarning is
not shown (REVIEW: it was logged by every worker with SERVING_CACHE_URL)."""

from __future__ import annotations

import subprocess
import sys

from tests.servers import ROOT

SCRIPT = """
import warnings
warnings.simplefilter("always")
import ssl, sys, urllib3.util.ssl_, redis
# Not every value in sys.modules is a module: Cython registers an object with no
# __name__ as cython.parallel (the H200 image's cython did; the workers failed to boot).
class CythonDotParallel:
    pass
sys.modules["cython.parallel"] = CythonDotParallel()
from serving_core.process.workers.patching import patch_worker
patch_worker()
import gevent.ssl
assert urllib3.util.ssl_.SSLContext is gevent.ssl.SSLContext, urllib3.util.ssl_.SSLContext
assert ssl.SSLContext is gevent.ssl.SSLContext
print("patched")
"""


def test_ssl_names_taken_before_the_patch_are_gevents_after_it() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "patched"
    assert "MonkeyPatchWarning" not in done.stderr, done.stderr
