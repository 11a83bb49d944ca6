"""This handler's image build step (the Dockerfile runs a handler folder's build.py):
train the model into the folder, so that the image serves it without training at
start, on a root filesystem it could not write anyway."""

from __future__ import annotations

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).with_name("train.py")), run_name="__main__")
