"""Settings: every ``SERVING_*`` variable, read once by ``Settings.from_env``.

- ``table``: the ``Settings`` fields, each with its parser, default and doc;
- ``parsers``, ``addresses`` and ``streams`` (a stream worker's broker URLs): what turns
  a variable's text into a value; ``grpcport``: SERVING_GRPC_PORT's rules with the rest;
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
from serving_core.settings.table import WorkerClass as WorkerClass
