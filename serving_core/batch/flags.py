"""``serving-core batch``'s flags and help, apart from what runs them.

The CLI builds every verb's parser, so ``serving-core healthcheck`` (the pods'
exec probe, started every few seconds) imports this module too: it imports
nothing but argparse. ``batch.command`` runs the flags.
"""

from __future__ import annotations

import argparse

DEFAULT_CHUNK_SIZE = 64

DESCRIPTION = """\
Run the handler over every record of a file or a database table, with no
HTTP: setup() once, then W forked workers (SERVING_WORKERS, else the usable
cores) in chunks of --chunk-size, each through the same engine as /predict.

Formats, by suffix: .jsonl/.ndjson, .csv, .parquet (a file or a directory),
a SQLAlchemy URL (sqlite:///x.db, postgresql://...) or a bare .db/.sqlite
path. Each output row is the id and either "output" or "error" (JSON text
in CSV, Parquet and SQL columns). Parquet output is a directory of part files.

Resume: a rerun with the same --output skips every id already written,
failed ones included; --retry-failed removes this shard's failed rows from
the output first, so their ids are predicted again (and written once). Records
without an id field get their 0-based position
in the input as their id, so give them an id (or an ORDER BY) when the input
may change between runs.

Shards: --shard I/N runs the records whose id hashes to I. In an Indexed Job,
pass --shards N and the index comes from JOB_COMPLETION_INDEX. JSONL and
CSV outputs get one file per shard (NAME.shard-I-of-N.jsonl); Parquet
directories and SQL tables are shared.

Exit status: 0 every record succeeded, 1 some failed (written with their
errors) or a worker died, 2 a configuration error, 130 interrupted.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--input", required=True, metavar="SRC", help="records to predict")
    parser.add_argument("--input-table", metavar="TABLE", help="SQL input: read this table")
    parser.add_argument("--input-query", metavar="SQL", help="SQL input: read this query")
    parser.add_argument("--output", required=True, metavar="DST", help="where results go")
    parser.add_argument(
        "--output-table",
        metavar="TABLE",
        help="SQL output: the table (default results; created if missing)",
    )
    parser.add_argument(
        "--id-field", default="id", help="the records' id column or key (default id)"
    )
    parser.add_argument("--handler", help="handler.py, its folder or a module (SERVING_HANDLER)")
    parser.add_argument("--workers", type=int, help="worker processes (SERVING_WORKERS)")
    parser.add_argument(
        "--chunk-size",
        type=int,
        default=DEFAULT_CHUNK_SIZE,
        help=f"records per work unit and per write (default {DEFAULT_CHUNK_SIZE})",
    )
    parser.add_argument("--shard", metavar="I/N", help="run shard I of N (0-based)")
    parser.add_argument(
        "--shards", type=int, metavar="N", help="N shards, this one from JOB_COMPLETION_INDEX"
    )
    parser.add_argument(
        "--retry-failed",
        action="store_true",
        help="predict again the ids the output holds as failed (their error rows are replaced)",
    )
    parser.add_argument(
        "--warm-cache",
        action="store_true",
        help="write each successful result into the inference cache (SERVING_CACHE_*)",
    )
