"""Is this iris a versicolor? One of the three classifiers behind handlers/iris-pipeline."""

import sys
from pathlib import Path

# The three iris handlers share one module, handlers/iris/onevsrest.py: handlers/
# goes on the path (an image of this handler needs handlers/iris/ too).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from iris.onevsrest import BinaryIris


class Versicolor(BinaryIris):
    name = "iris-versicolor"
    species = "versicolor"
