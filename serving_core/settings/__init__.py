"""Settings: every ``SERVING_*`` variable, read once by ``Settings.from_env``.

- ``table``: the ``Settings`` fields, each with its parser, default and doc;
- ``parsers`` and ``addresses``: what turns a variable's text into a value (a URL
  that picks a backend only needs a scheme here: the backend checks the rest);
  ``grpcport``: SERVING_GRPC_PORT's rules with the rest;
- ``secrets``: ``masked``, a URL without its password, for every message and log;
- ``redisurl``: a Redis URL's rules, checked by the cache's store and the job queue;
- ``private``: the default private directory (the SQLite queue's);
- ``doc``: writes ``docs/settings.md``'s table from ``Settings``.
"""

from serving_core.settings.table import DEFAULT_HANDLER as DEFAULT_HANDLER
from serving_core.settings.table import PREFIX as PREFIX
from serving_core.settings.table import BatchPolicy as BatchPolicy
from serving_core.settings.table import Dtype as Dtype
from serving_core.settings.table import LogFormat as LogFormat
from serving_core.settings.table import LogLevel as LogLevel
from serving_core.settings.table import ModelProcessMode as ModelProcessMode
from serving_core.settings.table import Settings as Settings
from serving_core.settings.table import SettingsError as SettingsError
from serving_core.settings.table import Traces as Traces
from serving_core.settings.table import WorkerClass as WorkerClass
