"""Parquet records: a file or a directory of files in; a directory of part files out.

A Parquet file cannot be appended to, and one written at the end is lost
whole to a kill. So the output is a directory (``out.parquet/``, the layout
Spark and ``pyarrow.dataset`` write and ``pandas.read_parquet`` reads) with
one part file per chunk, written under a hidden temporary name and renamed:
a part file is there whole or not at all, and resume reads the ids of the
parts that are there. Part names carry the shard, so the pods of one Indexed
Job can write into one directory without clashing.

Columns: ``ID_FIELD`` (the id as text), ``output`` and ``error`` (JSON text;
one of them null).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from serving_core.batch.records import Record, RecordsError, Row, Shard, make_record

READ_BATCH_ROWS = 1024


class ParquetSource:
    def __init__(self, path: str, id_field: str) -> None:
        self._id_field = id_field
        root = Path(path)
        names = sorted(root.rglob("*.parquet")) if root.is_dir() else [root]
        # Hidden and underscore files are a writer's temporaries and metadata.
        self._files = [f for f in names if not f.name.startswith((".", "_"))]
        try:
            self._rows = int(sum(pq.ParquetFile(f).metadata.num_rows for f in self._files))
        except (OSError, pa.ArrowInvalid) as exc:
            raise RecordsError(f"--input {path} cannot be read as Parquet: {exc}") from exc

    def count(self) -> int | None:
        return self._rows

    def __iter__(self) -> Iterator[Record]:
        position = 0
        for file in self._files:
            for batch in pq.ParquetFile(file).iter_batches(batch_size=READ_BATCH_ROWS):
                for fields in batch.to_pylist():
                    yield make_record(fields, position, self._id_field)
                    position += 1

    def close(self) -> None:
        pass


class ParquetSink:
    def __init__(self, path: str, id_field: str, shard: Shard) -> None:
        self.where = path
        self._root = Path(path)
        if self._root.is_file():
            raise RecordsError(
                f"--output {path} is a file; Parquet output is a directory of part files "
                "(one per chunk, so that a killed run can resume): name a new path"
            )
        self._root.mkdir(parents=True, exist_ok=True)
        self._id_field = id_field
        self._prefix = f"part-{shard.index}of{shard.count}-"
        self._next = 0
        self._schema = pa.schema(
            [(id_field, pa.string()), ("output", pa.string()), ("error", pa.string())]
        )

    def written(self) -> dict[str, bool]:
        for stale in self._root.glob(f".{self._prefix}*.tmp"):
            stale.unlink()  # this shard's part that a kill caught mid-write
        keys: dict[str, bool] = {}
        mine = re.compile(re.escape(self._prefix) + r"(\d+)\.parquet")
        for part in sorted(self._root.glob("part-*.parquet")):
            table = pq.read_table(part, columns=[self._id_field, "error"])
            ids = table.column(self._id_field).to_pylist()
            errors = table.column("error").to_pylist()
            keys.update((str(key), error is None) for key, error in zip(ids, errors, strict=True))
            match = mine.fullmatch(part.name)
            if match is not None:
                self._next = max(self._next, int(match[1]) + 1)
        return keys

    def write(self, rows: Sequence[Row]) -> None:
        table = pa.table(
            [
                [row.key for row in rows],
                [None if row.output is None else row.output.decode() for row in rows],
                [None if row.error is None else row.error.decode() for row in rows],
            ],
            schema=self._schema,
        )
        name = f"{self._prefix}{self._next:06d}.parquet"
        temporary = self._root / f".{name}.tmp"
        pq.write_table(table, temporary)
        os.replace(temporary, self._root / name)
        self._next += 1

    def close(self) -> None:
        pass
