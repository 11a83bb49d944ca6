"""How a ``SERVING_*`` value is read: one ``Parser`` per kind of value, and ``setting()``,
which declares a ``Settings`` field with its default, parser and one-line doc.

A parser turns the variable's text into a typed value, or raises ``ValueError``
with a message that names the variable, the value (never a key's) and what
would be accepted; ``Settings.from_env`` turns that into ``SettingsError``.
Each parser also says in words what it accepts, which the settings reference
(``docs/settings.md``, written by ``settings.doc``) shows beside the variable.
The parsers of addresses (bind, URLs, origins, proxies) are in ``addresses``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, get_args

T = TypeVar("T")

# A maximum from here up is shown as none ("1 or more") in the docs.
UNBOUNDED = 1 << 30


@dataclass(frozen=True)
class Parser(Generic[T]):
    """``parser(variable, text)`` reads a value; ``accepts`` says what it takes (markdown)."""

    parse: Callable[[str, str], T]
    accepts: str
    choices: tuple[str, ...] = ()

    def __call__(self, name: str, raw: str) -> T:
        return self.parse(name, raw)


@dataclass(frozen=True)
class Spec:
    """What a field of ``Settings`` carries besides its default: how to read it, its doc."""

    parser: Parser[Any]
    doc: str  # one line, markdown: the reference table's "meaning"
    shown: str | None = None  # the default in words, where from_env resolves it


def setting(
    default: Any, parser: Parser[Any], doc: str, *, shown: str | None = None, secret: bool = False
) -> Any:
    """A ``Settings`` field: its default, parser and doc (``secret``: never in a repr)."""
    return field(default=default, repr=not secret, metadata={"spec": Spec(parser, doc, shown)})


def spec(setting_field: dataclasses.Field[Any]) -> Spec:
    """The field's ``Spec``; a field declared without ``setting()`` is a bug, named here."""
    found = setting_field.metadata.get("spec")
    if not isinstance(found, Spec):
        raise TypeError(
            f"Settings.{setting_field.name} is not declared with setting(default, parser, doc)"
        )
    return found


def _plain(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else str(value)


def _range(kind: str, minimum: float, maximum: float) -> str:
    if maximum >= UNBOUNDED:
        return f"{kind}, {_plain(minimum)} or more"
    return f"{kind}, {_plain(minimum)} to {_plain(maximum)}"


def _within(name: str, raw: str, value: float, minimum: float, maximum: float) -> None:
    if math.isnan(value) or not minimum <= value <= maximum:
        raise ValueError(f"{name}={raw!r} is out of range; use {minimum}..{maximum}")


def integer(minimum: int, maximum: int) -> Parser[int]:
    def parse(name: str, raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(
                f"{name}={raw!r} is not an integer; set it to e.g. {minimum}"
            ) from None
        _within(name, raw, value, minimum, maximum)
        return value

    return Parser(parse, _range("integer", minimum, maximum))


def number(minimum: float, maximum: float) -> Parser[float]:
    def parse(name: str, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{name}={raw!r} is not a number; set it to e.g. {minimum}") from None
        _within(name, raw, value, minimum, maximum)
        return value

    return Parser(parse, _range("number", minimum, maximum))


def choice(*choices: str) -> Parser[str]:
    def parse(name: str, raw: str) -> str:
        value = raw.lower()
        if value not in choices:
            raise ValueError(f"{name}={raw!r} is not one of: {', '.join(choices)}")
        return value

    return Parser(parse, ", ".join(f"`{c}`" for c in choices), choices)


def one_of(kind: Any) -> Parser[str]:
    """The choices of a ``Literal`` type, so that the field's type names them once."""
    return choice(*get_args(kind))


def _text(name: str, raw: str) -> str:
    return raw


TEXT = Parser(_text, "any text")


def _bool(name: str, raw: str) -> bool:
    value = raw.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={raw!r} is not a boolean; use true or false")


BOOLEAN = Parser(_bool, "`true` or `false` (also 1/0, yes/no, on/off)", ("true", "false"))


def _device(name: str, raw: str) -> str:
    value = raw.lower()
    index = value.removeprefix("cuda:")
    if value in ("cpu", "cuda", "auto") or (value.startswith("cuda:") and index.isdigit()):
        return value
    raise ValueError(
        f"{name}={raw!r} is not a device; use cpu, cuda, cuda:N (the N-th GPU) or auto "
        "(cuda when a GPU is visible, else cpu)"
    )


DEVICE = Parser(_device, "`cpu`, `cuda`, `cuda:N`, `auto`")

# Printable ASCII without spaces or commas (the list separator): what a header carries.
_KEY = re.compile(r"[!-+\--~]+")
MIN_KEY_CHARS = 16


def api_keys(name: str, raw: str) -> tuple[str, ...]:
    """Keys from a comma-separated list or a file's lines; errors never quote a key."""
    keys = tuple(key.strip() for key in re.split(r"[,\n]", raw) if key.strip())
    for index, key in enumerate(keys, 1):
        if len(key) < MIN_KEY_CHARS or not _KEY.fullmatch(key):
            raise ValueError(
                f"{name}: key {index} of {len(keys)} is not {MIN_KEY_CHARS} or more printable "
                "ASCII characters without spaces or commas; make keys with e.g. "
                "`openssl rand -hex 32`"
            )
    return keys


API_KEYS = Parser(
    api_keys, f"comma-separated keys, each {MIN_KEY_CHARS}+ printable ASCII characters"
)


_NAME = re.compile(r"[^,\s]+")


def _names(name: str, raw: str) -> tuple[str, ...]:
    names = tuple(entry.strip() for entry in raw.split(",") if entry.strip())
    for entry in names:
        if not _NAME.fullmatch(entry):
            raise ValueError(
                f"{name} holds {entry!r}, which is not a field name; use comma-separated "
                "names without spaces, e.g. ssn,email"
            )
    return names


NAMES = Parser(_names, "comma-separated names")


def _path(name: str, raw: str) -> str:
    if not raw.startswith("/"):
        raise ValueError(f"{name}={raw!r} is not an absolute path; use e.g. /run/secrets/keys")
    return raw


ABSOLUTE_PATH = Parser(_path, "an absolute path")
