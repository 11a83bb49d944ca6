"""Records in any SQLAlchemy database: a table or a query in, a table out.

Out: the table ``(ID_FIELD VARCHAR(255) PRIMARY KEY, output TEXT, error TEXT)``,
created when missing, one transaction per chunk. A kill rolls back the chunk
in flight, and the primary key makes writing a record twice impossible (the
pods of an Indexed Job can share one table). SQLite output is switched to WAL
journalling, so that the input can be read from the same file while the
output is written (in SQLite's default mode a long read blocks every commit).
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Sequence
from typing import Any

import sqlalchemy as sa

from serving_core.batch.records import (
    DEFAULT_OUTPUT_TABLE,
    Location,
    Record,
    RecordsError,
    RecordSink,
    RecordSource,
    Row,
    Shard,
    make_record,
)
from serving_core.settings.secrets import masked, scrubbed

DATABASE = True
READ_BATCH_ROWS = 1000
DELETE_BATCH_KEYS = 500  # bound parameters per DELETE (SQLite allows 32,766, older ones 999)
SQLITE_BUSY_TIMEOUT_S = 60  # shards committing to one SQLite file take turns
ID_LENGTH = 255  # a primary key must be bounded on MySQL; ids are short


def open_source(location: Location, id_field: str) -> RecordSource:
    return SqlSource(location.target, id_field, table=location.table, query=location.query)


def open_sink(location: Location, id_field: str, shard: Shard) -> RecordSink:
    # Not a table per shard: the primary key lets the shards share one.
    return SqlSink(location.target, id_field, location.table or DEFAULT_OUTPUT_TABLE)


def _engine(url: str, flag: str) -> sa.Engine:
    try:
        parsed = sa.make_url(url)
    except ValueError:  # the one ValueError of SQLAlchemy's parse: int(port)
        raise RecordsError(
            f"{flag} {masked(url)}: the port after HOST: is not a number; fix it, and "
            "percent-encode any ':', '/', '@', '?' or '#' in the user or password "
            "(%3A, %2F, %40, %3F, %23)"
        ) from None
    except sa.exc.ArgumentError as exc:
        raise RecordsError(
            f"{flag} {masked(url)}: not a database URL SQLAlchemy can open: {_said(exc, url)}"
        ) from exc
    try:
        sqlite = parsed.get_backend_name() == "sqlite"
        options: dict[str, Any] = {"timeout": SQLITE_BUSY_TIMEOUT_S} if sqlite else {}
        return sa.create_engine(parsed, connect_args=options)
    except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError, ImportError, ValueError) as exc:
        raise RecordsError(
            f"{flag} {masked(url)}: not a database URL SQLAlchemy can open: {_said(exc, url)}"
        ) from exc


def _said(exc: BaseException, url: str) -> str:
    """A driver's or SQLAlchemy's message, on one line, with the URL's secrets hidden
    wherever it repeats them."""
    return " ".join(scrubbed(str(exc), url).split())


def _shown(engine: sa.Engine) -> str:
    return masked(engine.url.render_as_string(hide_password=False))


class SqlSource:
    def __init__(self, url: str, id_field: str, *, table: str | None, query: str | None) -> None:
        self._id_field = id_field
        self._engine = _engine(url, "--input")
        self._rows: int | None = None
        try:
            self._connection = self._engine.connect()
            statement: sa.Executable
            if table is not None:
                source = sa.Table(table, sa.MetaData(), autoload_with=self._connection)
                self._rows = self._connection.execute(
                    sa.select(sa.func.count()).select_from(source)
                ).scalar_one()
                statement = sa.select(source)
                key = list(source.primary_key.columns)
                if id_field not in source.columns and key:
                    # Positions become ids: a stable order keeps them the same on a rerun.
                    statement = statement.order_by(*key)
            else:
                statement = sa.text(str(query))
            self._result = self._connection.execution_options(
                stream_results=True, yield_per=READ_BATCH_ROWS
            ).execute(statement)
        except sa.exc.NoSuchTableError as exc:
            raise RecordsError(
                f"--input-table {table}: no such table in {_shown(self._engine)}"
            ) from exc
        except sa.exc.SQLAlchemyError as exc:
            raise RecordsError(f"--input {_shown(self._engine)}: {_said(exc, url)}") from exc

    def count(self) -> int | None:
        return self._rows

    def __iter__(self) -> Iterator[Record]:
        for position, row in enumerate(self._result):
            yield make_record(dict(row._mapping), position, self._id_field)

    def close(self) -> None:
        self._result.close()
        self._connection.close()
        self._engine.dispose()


class SqlSink:
    def __init__(self, url: str, id_field: str, table: str) -> None:
        self._engine = _engine(url, "--output")
        self.where = f"{_shown(self._engine)} table {table}"
        self._id_field = id_field
        if self._engine.dialect.name == "sqlite":
            sa.event.listen(self._engine, "connect", _sqlite_wal)
        self._table = sa.Table(
            table,
            sa.MetaData(),
            sa.Column(id_field, sa.String(ID_LENGTH), primary_key=True),
            sa.Column("output", sa.Text),
            sa.Column("error", sa.Text),
        )
        # Another shard may have created it a moment ago; the check below decides.
        with contextlib.suppress(sa.exc.SQLAlchemyError):
            self._table.create(self._engine, checkfirst=True)
        try:
            columns = {c["name"] for c in sa.inspect(self._engine).get_columns(table)}
        except sa.exc.SQLAlchemyError as exc:
            raise RecordsError(f"--output {self.where}: {_said(exc, url)}") from exc
        missing = {id_field, "output", "error"} - columns
        if missing:
            raise RecordsError(
                f"--output-table {table} exists without the columns {', '.join(sorted(missing))}; "
                "name a new table (it is created) or one an earlier batch run wrote"
            )

    def written(self) -> dict[str, bool]:
        key = self._table.c[self._id_field]
        with self._engine.connect() as connection:
            rows = connection.execute(sa.select(key, self._table.c.error.is_(None)))
            return {str(k): bool(ok) for k, ok in rows}

    def drop_failed(self, keys: Collection[str]) -> None:
        key = self._table.c[self._id_field]
        ordered = sorted(keys)
        with self._engine.begin() as connection:  # all of them, or (after a kill) none
            for at in range(0, len(ordered), DELETE_BATCH_KEYS):
                chosen = ordered[at : at + DELETE_BATCH_KEYS]
                connection.execute(
                    sa.delete(self._table).where(key.in_(chosen), self._table.c.error.is_not(None))
                )

    def write(self, rows: Sequence[Row]) -> None:
        values = [
            {
                self._id_field: row.key,
                "output": None if row.output is None else row.output.decode(),
                "error": None if row.error is None else row.error.decode(),
            }
            for row in rows
        ]
        with self._engine.begin() as connection:
            connection.execute(sa.insert(self._table), values)

    def close(self) -> None:
        self._engine.dispose()


def _sqlite_wal(connection: Any, record: Any) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.close()
