"""One binary iris classifier per species: the three halves of a one-vs-rest model.

Shared by ``handlers/iris-setosa``, ``iris-versicolor`` and ``iris-virginica``,
each a three-line subclass naming its species; ``handlers/iris-pipeline`` asks
the three at once and answers with the most probable species. Each trains in
``setup()`` on scikit-learn's bundled iris data (150 rows, milliseconds), so
nothing is downloaded or saved. The model is the one ``OneVsRestClassifier``
fits for that species: ``LogisticRegression`` on "is it this species?".
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression

from serving_core import Handler

SPECIES = ("setosa", "versicolor", "virginica")  # load_iris's target order
FEATURES = ("sepal_length", "sepal_width", "petal_length", "petal_width")  # cm
INPUT_SCHEMA = {
    "type": "object",
    "properties": {name: {"type": "number", "minimum": 0} for name in FEATURES},
    "required": list(FEATURES),
}


def estimator() -> LogisticRegression:
    """The binary model, the same for each species and for the one-vs-rest reference."""
    return LogisticRegression(max_iter=1000)


def rows(batch: list[dict[str, Any]]) -> np.ndarray:
    return np.array([[float(params[name]) for name in FEATURES] for params in batch])


class BinaryIris(Handler):
    """``{"label": species, "probability": P(species)}`` for one flower's measurements."""

    species: ClassVar[str]
    version = "1"
    input_schema = INPUT_SCHEMA

    def setup(self) -> None:
        features, target = load_iris(return_X_y=True)
        self.model = estimator().fit(features, target == SPECIES.index(self.species))

    def predict_batch(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        probabilities = self.model.predict_proba(rows(batch))[:, 1]
        return [{"label": self.species, "probability": float(p)} for p in probabilities]
