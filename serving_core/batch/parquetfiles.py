"""Parquet records: a file or a directory of files in; a directory of part files out.

A Parquet file cannot be appended to, and one written at the end is lost
whole to a kill. So the output is a directory (``out.parquet/``, the layout
Spark and ``pyarrow.dataset`` write and ``pandas.read_parquet`` reads) with
one part file per chunk, written under a new hidden temporary name
(``durable``), fsynced, renamed, and the directory fsynced: a part file is
there whole or not at all, even after a power cut, and resume reads the ids
of the parts that are there. A part that cannot be read anyway (a copy cut short, a disk that lied)
stops the run with the part's name and the fix: delete it and rerun. Part
names carry the shard, so the pods of one Indexed Job can write into one
directory without clashing.

Columns: ``ID_FIELD`` (the id as text), ``output`` and ``error`` (JSON text;
one of them null).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from serving_core.batch.durable import fsync_directory, replacing
from serving_core.batch.records import (
    Location,
    Record,
    RecordsError,
    RecordSink,
    RecordSource,
    Row,
    Shard,
    make_record,
)

DATABASE = False
READ_BATCH_ROWS = 1024


def open_source(location: Location, id_field: str) -> RecordSource:
    return ParquetSource(location.target, id_field)


def open_sink(location: Location, id_field: str, shard: Shard) -> RecordSink:
    # Not sharded_path: the shards write part files into one directory.
    return ParquetSink(location.target, id_field, shard)


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
        if not self._root.is_dir():
            try:
                self._root.mkdir(parents=True, exist_ok=True)  # shards may race here
            except OSError as exc:
                raise RecordsError(f"--output {path} cannot be made: {exc.strerror}") from exc
            fsync_directory(self._root.parent)
        self._id_field = id_field
        self._shard = shard
        self._prefix = f"part-{shard.index}of{shard.count}-"
        self._next = 0
        self._failed: dict[Path, set[str]] = {}  # the parts that hold error rows, their keys
        self._schema = pa.schema(
            [(id_field, pa.string()), ("output", pa.string()), ("error", pa.string())]
        )

    def written(self) -> dict[str, bool]:
        keys: dict[str, bool] = {}
        self._failed = {}
        mine = re.compile(re.escape(self._prefix) + r"(\d+)\.parquet")
        for part in sorted(self._root.glob("part-*.parquet")):
            ids, errors = self._read(part)
            keys.update((str(key), error is None) for key, error in zip(ids, errors, strict=True))
            failed = {str(key) for key, error in zip(ids, errors, strict=True) if error is not None}
            if failed:
                self._failed[part] = failed
            match = mine.fullmatch(part.name)
            if match is not None:
                self._next = max(self._next, int(match[1]) + 1)
        # Only once every part was read: a refused run changes nothing.
        for stale in self._root.glob(f".{self._prefix}*.tmp"):
            stale.unlink()  # this shard's part that a kill caught mid-write
        return keys

    def _read(self, part: Path) -> tuple[list[object], list[object]]:
        try:
            columns = pq.read_schema(part).names
            if self._id_field not in columns:
                raise RecordsError(
                    f"--output {self.where} has the columns {','.join(columns)} ({part.name}), "
                    f"not {','.join(self._schema.names)}; choose another output "
                    "(or the same --id-field)"
                )
            table = pq.read_table(part, columns=[self._id_field, "error"])
        except (OSError, pa.ArrowInvalid) as exc:
            raise RecordsError(
                f"--output {self.where}: the part {part} cannot be read ({exc}); a power cut "
                f"or a copy cut it short. Delete it (rm '{part}') and rerun: the rerun "
                "predicts its records again, and reads every other part"
            ) from exc
        return table.column(self._id_field).to_pylist(), table.column("error").to_pylist()

    def drop_failed(self, keys: Collection[str]) -> None:
        """Each part that holds one of ``keys`` is rewritten without those rows (or
        removed, if nothing is left). Shards share the directory, so a shard rewrites
        only its own parts: another shard may be rewriting the others."""
        wanted = set(keys)
        parts = {part: failed & wanted for part, failed in self._failed.items()}
        parts = {part: dropped for part, dropped in parts.items() if dropped}
        foreign = [p.name for p in parts if not p.name.startswith(self._prefix)]
        if foreign and self._shard.count > 1:
            raise RecordsError(
                f"--retry-failed: {self.where} holds this shard's failed ids in parts another "
                f"shard count wrote ({', '.join(sorted(foreign)[:3])}): rerun --retry-failed "
                f"with the --shards those parts were written with, or as one run without "
                "--shard/--shards; nothing was changed"
            )
        for part, dropped in sorted(parts.items()):
            table = pq.read_table(part)
            ids = table.column(self._id_field).to_pylist()
            errors = table.column("error").to_pylist()
            kept = [
                i
                for i, (key, error) in enumerate(zip(ids, errors, strict=True))
                if error is None or str(key) not in dropped
            ]
            if kept:
                self._replace(part, table.take(kept))
            else:
                part.unlink()
                fsync_directory(self._root)
            self._failed[part] -= dropped

    def write(self, rows: Sequence[Row]) -> None:
        table = pa.table(
            [
                [row.key for row in rows],
                [None if row.output is None else row.output.decode() for row in rows],
                [None if row.error is None else row.error.decode() for row in rows],
            ],
            schema=self._schema,
        )
        self._replace(self._root / f"{self._prefix}{self._next:06d}.parquet", table)
        self._next += 1

    def _replace(self, part: Path, table: pa.Table) -> None:
        # The part's bytes reach the disk before its name does, and the name
        # before the next part is written: a power cut leaves a hidden
        # temporary (removed on resume), never a named part that is torn. A
        # part rewritten by --retry-failed keeps its mode.
        mode = part.stat().st_mode & 0o7777 if part.exists() else None
        with replacing(part, mode) as file:
            pq.write_table(table, file)

    def close(self) -> None:
        pass
