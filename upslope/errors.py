"""User-facing errors: one clear line, no traceback."""
from __future__ import annotations

import difflib
from typing import Callable, Iterable


def one_line(text: str) -> str:
    """An error message as one line (a library's multi-line message is joined)."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def did_you_mean(name: str, choices: Iterable[str], *, shown: Callable[[str], str] = str, paren: bool = True) -> str:
    """" (did you mean 'X'?)" naming the choice closest to a mistyped `name` (difflib's best match), or "" when
    none is close; `shown` renders the match (a dotted path, a prefix), `paren=False` gives "; did you mean 'X'?"."""
    near = difflib.get_close_matches(name, list(choices), n=1)
    if not near:
        return ""
    text = f"did you mean '{shown(near[0])}'?"
    return f" ({text})" if paren else f"; {text}"


class UpslopeError(Exception):
    """A mistake in the user's input (file, option, data). The CLI prints it as one line."""


class ConfigError(UpslopeError):
    """A config key or value is wrong."""


class DataError(UpslopeError):
    """A data file is malformed or misses a field."""


class ModelError(UpslopeError):
    """A model or tokenizer cannot be resolved or loaded."""


class EngineUnavailable(UpslopeError):
    """A rollout engine cannot run this model here (an architecture the engine's build lacks, or an
    engine that failed to start): `engine.name=auto` falls back to the next engine, an explicit name stops."""


class SetupError(UpslopeError):
    """This machine cannot do what the run asks (e.g. the code sandbox cannot start programs):
    the run stops instead of scoring every sample as a failure."""
