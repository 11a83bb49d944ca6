"""Finds the user's ``Handler`` from ``SERVING_HANDLER`` and checks its contract.

Accepted forms: a file (``handlers/minilm/handler.py``), a folder holding
``handler.py``, or a module path (``handlers.minilm.handler``); any of them may
end in ``:ClassName`` to pick one class. A pipeline file
(``handlers/iris-pipeline/pipeline.yaml``), or a folder holding one and no
``handler.py``, is served by a ``serving_core.pipeline.pipeline.Pipeline`` built from it.
Every failure is a ``HandlerError`` whose message names the file and says how
to fix it; ``serving-core serve`` prints it and stops before fork.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema

from serving_core.errors import HandlerError
from serving_core.handler import Handler, has_predict, is_batched, is_generating
from serving_core.pipeline.pipeline import load as load_pipeline
from serving_core.runtime import THREADS, Runtime


@dataclass(frozen=True)
class LoadedHandler:
    handler: Handler
    source: str  # the file (or module) it came from, for messages
    sample: dict[str, Any] | None  # sample.json beside handler.py, if any


PIPELINE_FILE = "pipeline.yaml"
log = logging.getLogger("serving_core.loading")


def load_handler(
    spec: str,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    environ: Mapping[str, str] | None = None,
    runtime: Runtime = THREADS,
) -> LoadedHandler:
    """Import the module named by ``spec`` and instantiate its one ``Handler`` subclass.

    ``device`` and ``dtype`` (``SERVING_DEVICE``, ``SERVING_DTYPE``) become the
    handler's ``self.device`` and ``self.dtype``, read from ``setup()`` on.
    ``environ`` is where a pipeline file's stage URL variables are looked up
    (the CLI passes ``os.environ``); without it they are all unset. ``runtime``:
    how a pipeline's stage calls wait (the gevent worker's, under ``serve``).
    """
    pipeline_file = _pipeline_file(spec)
    if pipeline_file is not None:
        pipeline = load_pipeline(pipeline_file, environ or {}, runtime)
        return LoadedHandler(pipeline, str(pipeline_file), _sample_at(pipeline_file.parent))
    target, _, class_name = spec.partition(":")
    module, source = _import(target)
    cls = _pick_class(module, source, class_name)
    if cls.concurrent and is_batched(cls):
        raise HandlerError(
            f"{source}: {cls.__name__} sets concurrent = True and implements predict_batch; a "
            "concurrent handler runs one item per call: implement predict(item) instead"
        )
    if not has_predict(cls):
        raise HandlerError(
            f"{source}: {cls.__name__} implements neither predict(params) -> dict nor "
            "predict_batch(list[dict]) -> list[dict]; implement one of them (or generate "
            "or step, for a handler that answers in chunks)"
        )
    if is_generating(cls) and (
        cls.concurrent or is_batched(cls) or cls.predict is not Handler.predict
    ):
        raise HandlerError(
            f"{source}: {cls.__name__} generates (generate or step) and also sets concurrent "
            "or implements predict/predict_batch; a generating handler answers only in chunks: "
            "keep generate(item) or step(generations), and drop the others"
        )
    if cls.text is not None and not is_generating(cls):
        raise HandlerError(
            f"{source}: {cls.__name__} sets text = TextGeneration(...) but does not generate; "
            "implement generate(item) or step(generations), or drop text"
        )
    _check_schema(cls, source)
    try:
        handler = cls()
    except Exception as exc:
        raise HandlerError(
            f"{source}: {cls.__name__}() failed: {exc!r}; a handler's __init__ must take "
            "no arguments (load models in setup())"
        ) from exc
    handler.device = device
    handler.dtype = dtype
    return LoadedHandler(handler, source, _sample(module))


def give_artifacts(handler: Handler, uri: str, cache: str, *, offline: bool) -> None:
    """Fetch what ``uri`` (SERVING_MODEL_URI) names into ``cache``, verified, and hand
    the handler its directory (``model_dir``) and revision; nothing without a URI.

    Called once the handler has loaded (a broken one fails before a long download)
    and before ``setup()``, in the one process that preloads. A fetch that fails is
    a ``HandlerError`` naming the URI without its credentials.
    """
    if not uri:
        return
    # Imported here: obstore and the stores' code load only where a URI is set.
    from serving_core.artifacts.fetcher import FetchError, fetch_model

    try:
        fetched = fetch_model(uri, Path(cache), offline=offline)
    except FetchError as exc:
        raise HandlerError(str(exc)) from exc
    handler.model_dir = fetched.path
    handler.artifacts_revision = fetched.revision
    log.info(
        "model artifacts %s at %s (%d bytes fetched)",
        fetched.revision,
        fetched.path,
        fetched.fetched_bytes,
    )


def _pipeline_file(spec: str) -> Path | None:
    path = Path(spec)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise HandlerError(
                f"pipeline file {path} does not exist; set SERVING_HANDLER to a pipeline.yaml "
                "file or its folder"
            )
        return path
    if path.is_dir() and not (path / "handler.py").exists() and (path / PIPELINE_FILE).is_file():
        return path / PIPELINE_FILE
    return None


def _import(target: str) -> tuple[ModuleType, str]:
    path = Path(target)
    if path.is_dir():
        path = path / "handler.py"
    if target.endswith(".py") or path.suffix == ".py" or path.exists():
        if not path.is_file():
            raise HandlerError(
                f"handler file {path} does not exist; set SERVING_HANDLER to a handler.py "
                "file, its folder, or a module path like handlers.minilm.handler"
            )
        return _import_file(path.resolve()), str(path)
    try:
        return importlib.import_module(target), target
    except ModuleNotFoundError as exc:
        if exc.name is not None and target.startswith(exc.name):
            raise HandlerError(
                f"handler module {target!r} was not found; set SERVING_HANDLER to a "
                "handler.py path or an importable module path"
            ) from exc
        raise HandlerError(f"{target}: importing it failed: {exc!r}") from exc
    except Exception as exc:
        raise HandlerError(f"{target}: importing it failed: {exc!r}") from exc


def _import_file(path: Path) -> ModuleType:
    # The handler's folder goes first on sys.path so that it can import the
    # modules beside it, as a script would.
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = f"serving_handler_{abs(hash(str(path))):x}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise HandlerError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise HandlerError(f"{path}: importing it failed: {exc!r}") from exc
    return module


def _pick_class(module: ModuleType, source: str, class_name: str) -> type[Handler]:
    if class_name:
        cls = getattr(module, class_name, None)
        if not (inspect.isclass(cls) and issubclass(cls, Handler)):
            raise HandlerError(
                f"{source}: {class_name!r} is not a Handler subclass in this module; "
                "check the name after ':' in SERVING_HANDLER"
            )
        return cls
    found = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and issubclass(obj, Handler)
        and obj is not Handler
        and obj.__module__ == module.__name__
    ]
    if not found:
        raise HandlerError(
            f"{source}: no Handler subclass found; define "
            "`class MyHandler(serving_core.Handler)` with predict or predict_batch"
        )
    if len(found) > 1:
        names = ", ".join(sorted(c.__name__ for c in found))
        raise HandlerError(
            f"{source}: several Handler subclasses ({names}); pick one with "
            f"SERVING_HANDLER={source}:{sorted(c.__name__ for c in found)[0]}"
        )
    return found[0]


def _check_schema(cls: type[Handler], source: str) -> None:
    schema = cls.input_schema
    if schema is None:
        return
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise HandlerError(
            f"{source}: {cls.__name__}.input_schema is not a valid JSON Schema: {exc.message}"
        ) from exc


def _sample(module: ModuleType) -> dict[str, Any] | None:
    if module.__file__ is None:
        return None
    return _sample_at(Path(module.__file__).parent)


def _sample_at(folder: Path) -> dict[str, Any] | None:
    sample = folder / "sample.json"
    if not sample.is_file():
        return None
    try:
        value = json.loads(sample.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise HandlerError(f"{sample}: not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise HandlerError(f"{sample}: must hold one JSON object, the request parameters")
    return value
