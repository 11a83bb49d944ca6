"""A cheap sentence embedding: hashed character n-grams, 384 dimensions, L2-normalised.

The fast half of the time-lag example (seed 002 §4.9). It needs no weights and
answers in microseconds, so `/predict` replies at once; with
``SERVING_FOLLOWUP_QUEUE=all-minilm-l6-v2`` the same request is queued for
the MiniLM handler, and `serving-core worker` running that handler puts the
better embedding at the answer's ``status_url``:

    SERVING_HANDLER=handlers/hashembed SERVING_FOLLOWUP_QUEUE=all-minilm-l6-v2 make serve
    SERVING_HANDLER=handlers/minilm serving-core worker   # SERVING_BIND=127.0.0.1:9090

Same input as the MiniLM handler (``{"text": ...}``) and the same shape of
answer (``{"embedding": [384 floats]}``), so a client can use the quick vector
now and swap in the better one when its job is done.
"""

from __future__ import annotations

from typing import Any

from sklearn.feature_extraction.text import HashingVectorizer

from serving_core import Handler

DIMENSIONS = 384  # as all-minilm-l6-v2, so the two answers have one shape


class HashEmbedding(Handler):
    name = "hash-embedding"
    version = "1"
    input_schema = {
        "type": "object",
        "properties": {"text": {"type": "string", "minLength": 1, "maxLength": 100_000}},
        "required": ["text"],
    }

    def setup(self) -> None:
        # Stateless: nothing to fit or load, so every worker shares nothing but code.
        self.vectorizer = HashingVectorizer(
            n_features=DIMENSIONS, analyzer="char_wb", ngram_range=(2, 4), norm="l2"
        )

    def predict_batch(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        rows = self.vectorizer.transform([params["text"] for params in batch]).toarray()
        return [{"embedding": row.astype("float32")} for row in rows]
