"""The contract a user implements: one ``Handler`` subclass in ``handler.py``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from serving_core import generation
from serving_core.generation import Final, Generation, TextGeneration

Params = dict[str, Any]
Output = dict[str, Any]


@dataclass(frozen=True)
class Tensor:
    """One named tensor of the Open Inference Protocol (V2) and the field it carries.

    ``datatype`` is V2's (``BYTES``, ``BOOL``, ``INT8``..``INT64``,
    ``UINT8``..``UINT64``, ``FP16``, ``FP32``, ``FP64``). ``shape`` is one row's,
    without the batch dimension: ``()`` a scalar per row, ``(384,)`` a vector,
    ``-1`` a dimension of any size. ``field`` is the key in the handler's
    parameters (an input) or output dict (an output); empty: the tensor's name.
    """

    name: str
    datatype: str
    shape: tuple[int, ...] = ()
    field: str = ""

    @property
    def key(self) -> str:
        return self.field or self.name


@dataclass(frozen=True)
class Tensors:
    """How a handler's dicts map to V2's named tensors (``Handler.tensors``).

    Each row of a V2 request's batch dimension is one parameters dict; each
    output dict is one row of the response's tensors. ``outputs=None``: every
    key of the output dict, as it comes.
    """

    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...] | None = None


class InvalidInput(Exception):
    """Raise from any hook to answer this request with 400 and this message.

    Raised from ``predict_batch``, it fails only the item that caused it:
    serving-core re-runs the batch in halves to find that item. A handler that
    knows which item is bad can instead put ``InvalidInput(...)`` in that
    item's place in the returned list, which costs no re-run.
    """


class Handler:
    """Subclass this in ``handler.py`` and implement ``predict`` or ``predict_batch``.

    Hooks run in this order:

    - ``setup()``: once, in the gunicorn master before fork (load the model and
      tokenizer here so that workers share their memory). Torch is capped at
      one thread in the master, because a multi-threaded operation before fork
      hangs the workers (GNU OpenMP is not fork-safe); computing here (tracing,
      a warm-up) is safe but slows start-up.
    - ``setup_worker()``: once per worker after fork (per-process state, GPU moves:
      ``serving_core.device.resolve(self.device)`` says where to move to).
    - ``preprocess(params)``: where the request runs, before it is queued
      (validation, cheap per-item work). With gevent workers (the default)
      that is the worker's one hub thread, so keep it short: it holds up the
      worker's other requests while it runs; with gthread, a request thread.
      Its return value is what the model thread receives.
    - ``predict_batch(items)`` or ``predict(item)``: on the worker's single model thread.
    - ``postprocess(output, params)``: where the request runs, as ``preprocess``.
    - ``ready()``: whether this worker can answer now, asked by ``/readyz``
      (keep it cheap: it is polled); True by default.

    ``concurrent = True`` changes where ``predict`` runs: where the request
    runs, one item per call, many calls at once, with no batcher and no model
    thread (``SERVING_MAX_QUEUE`` caps the requests in flight per worker;
    beyond it, 503). It is for handlers that wait rather than compute, such as
    a pipeline calling other services (``serving_core.pipeline.pipeline``): their
    requests must not queue behind one another. ``predict`` must then be safe
    to call concurrently, and under the gevent worker it should wait on
    sockets (which yield) rather than compute (which holds up the worker).
    """

    name: ClassVar[str] = ""
    version: ClassVar[str] = "0"
    #: JSON Schema for the request parameters; violations are 400s naming the field.
    input_schema: ClassVar[dict[str, Any] | None] = None
    #: ``SERVING_DEVICE`` and ``SERVING_DTYPE`` as requested (cpu, auto, cuda, cuda:N;
    #: float32, float16, bfloat16), set by serving-core before ``setup()``. Load on the
    #: CPU in ``setup()``; move in ``setup_worker()`` (see ``serving_core.device``).
    device: str = "cpu"
    dtype: str = "float32"
    #: The local directory holding the artifacts ``SERVING_MODEL_URI`` names, fetched and
    #: verified before ``setup()`` (or the baked-in folder itself); None when it is unset.
    #: Read the weights from here: a handler never downloads them (docs/artifacts.md).
    model_dir: Path | None = None
    #: Those artifacts' revision (``sha256:...``, from the store's listing); empty
    #: without them. serving-core adds it to every cache key, the access log and
    #: ``serving_model_info``.
    artifacts_revision: str = ""
    #: False keeps this handler's answers out of the inference cache (a model
    #: that samples, or answers that depend on the time).
    cacheable: ClassVar[bool] = True
    #: True: ``predict`` runs where the request runs, concurrently, without the
    #: batcher (see the class docstring); only ``predict``, not ``predict_batch``.
    concurrent: ClassVar[bool] = False
    #: Field names (any depth, any case) whose values payload logging writes as
    #: ``[redacted]``, besides SERVING_PAYLOAD_LOG_REDACT's and the defaults (api_key,
    #: apikey, authorization, password, token): docs/observability.md.
    redact: ClassVar[tuple[str, ...]] = ()
    #: How the Open Inference Protocol (V2, ``/v2/models/NAME/infer``) maps to the
    #: parameters and the output dict. None: inferred from ``input_schema`` (each
    #: property an input tensor of its name) and from each output's keys.
    tensors: ClassVar[Tensors | None] = None
    #: A generating handler (``generate`` or ``step``) that generates text: the OpenAI
    #: and V2 generate routes serve it (``serving_core.generation.TextGeneration``).
    text: ClassVar[TextGeneration | None] = None

    def setup(self) -> None:
        """Load the model; runs once in the master before the workers fork."""

    def setup_worker(self) -> None:
        """Per-worker initialisation after fork."""

    def ready(self) -> bool:
        """Whether this worker can answer now; ``/readyz`` asks it (keep it cheap)."""
        return True

    def preprocess(self, params: Params) -> Any:
        return params

    def postprocess(self, output: Output, params: Params) -> Output:
        return output

    def predict(self, item: Any) -> Output:
        raise NotImplementedError

    # Sequence, not list: list is invariant, so a user's ``-> list[dict[str, Any]]``
    # would not type-check as an override of ``-> list[Output | InvalidInput]``.
    def predict_batch(self, items: list[Any]) -> Sequence[Output | InvalidInput]:
        raise NotImplementedError

    # -- a handler that generates (``serving_core.generation`` says how it runs) --

    def generate(self, item: Any) -> Iterator[Output]:
        """The simple form: yield one request's chunks, in order."""
        raise NotImplementedError

    def step(self, generations: list[Generation]) -> Sequence[Output | Final | InvalidInput | None]:
        """The batched form: one model step for every running generation, one answer
        each, in order: a chunk, None (none this step), ``Final(chunk)`` or
        ``InvalidInput``. A generation's ``state`` is None at its first step."""
        raise NotImplementedError

    def collect(self, chunks: list[Output]) -> Output:
        """The one answer made of a generation's chunks, for ``/predict`` without a
        stream, jobs, batch runs, the stream worker and pipelines; ``postprocess``
        then runs on it. Default: strings joined, other fields listed."""
        return generation.join_chunks(chunks)

    def chat_prompt(self, messages: list[dict[str, Any]]) -> str:
        """A text generator's prompt for an OpenAI chat's ``messages``."""
        return generation.chat_prompt(messages)


def handler_name(handler: Handler) -> str:
    return handler.name or type(handler).__name__.lower()


def model_revision(handler: Handler, build: str) -> str:
    """The model as served: the image's build (``SERVING_MODEL_REVISION``) and the
    artifacts' revision, either one alone when the other is empty."""
    return "+".join(part for part in (build, handler.artifacts_revision) if part)


def is_batched(cls: type[Handler]) -> bool:
    return cls.predict_batch is not Handler.predict_batch


def has_predict(cls: type[Handler]) -> bool:
    return cls.predict is not Handler.predict or is_batched(cls) or is_generating(cls)


def is_generating(cls: type[Handler]) -> bool:
    """Whether it answers in chunks (``generate`` or ``step``)."""
    return cls.generate is not Handler.generate or steps_together(cls)


def steps_together(cls: type[Handler]) -> bool:
    """Whether it generates in the batched form (``step``), continuous batching."""
    return cls.step is not Handler.step


def call_batch(handler: Handler, items: list[Any]) -> list[Output | InvalidInput]:
    """Run the handler on ``items``, checking that it answers each one, in order."""
    if is_batched(type(handler)):
        outputs = handler.predict_batch(items)
        where = f"{type(handler).__name__}.predict_batch"
    else:
        outputs = [handler.predict(item) for item in items]
        where = f"{type(handler).__name__}.predict"
    if not isinstance(outputs, list | tuple):
        raise TypeError(
            f"{where} returned {type(outputs).__name__}; return a list with one dict per input"
        )
    outputs = list(outputs)
    if len(outputs) != len(items):
        raise TypeError(
            f"{where} returned {len(outputs)} outputs for {len(items)} inputs; "
            "return exactly one output per input, in the same order"
        )
    for output in outputs:
        if not isinstance(output, dict | InvalidInput):
            raise TypeError(
                f"{where} returned a {type(output).__name__} as an output; each output must be "
                "a dict (the JSON response; numpy arrays allowed) or an InvalidInput for a bad item"
            )
    return outputs
