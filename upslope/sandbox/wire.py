"""Plain data across the sandbox wall: a tagged JSON form of Python values, rebuilt on the
other side from built-in types only (so no object of the sender's can reach the receiver).

Stdlib only and self-contained: this file's source also runs inside the sandbox (the
server side of a function test) and in the checker process, which imports nothing of
upslope. A value is encoded as a small JSON tree; `decode` accepts exactly the tags below
and raises WireError on anything else (a subclass, an unknown tag, a bad shape).
"""
import json
import re

MAX_DEPTH = 64


class WireError(ValueError):
    """A value that cannot cross: not plain data, too deep, or malformed."""


def encode(value, depth=0):
    """The tagged JSON tree of a plain value (exact built-in types only)."""
    if depth > MAX_DEPTH:
        raise WireError("value nested too deeply")
    t = type(value)
    if value is None or t is bool or t is str:
        return value
    if t is int:
        return {"i": str(value)}
    if t is float:
        return {"f": repr(value)}
    if t is complex:
        return {"c": [repr(value.real), repr(value.imag)]}
    if t is bytes:
        return {"b": value.hex()}
    if t is list:
        return [encode(v, depth + 1) for v in value]
    if t is tuple:
        return {"t": [encode(v, depth + 1) for v in value]}
    if t is set or t is frozenset:
        return {"s" if t is set else "fs": [encode(v, depth + 1) for v in value]}
    if t is dict:
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    raise WireError("cannot send a value of type %s" % t.__name__)


def _float(text):
    if type(text) is not str:
        raise WireError("bad float")
    try:
        return float(text)
    except ValueError:
        raise WireError("bad float") from None


def decode(tree, depth=0):
    """Rebuild a value from its tagged tree: only built-in types come out."""
    if depth > MAX_DEPTH:
        raise WireError("value nested too deeply")
    t = type(tree)
    if tree is None or t is bool or t is str:
        return tree
    if t is list:
        return [decode(v, depth + 1) for v in tree]
    if t is not dict or len(tree) != 1:
        raise WireError("malformed value")
    ((tag, body),) = tree.items()
    if tag == "i":
        if type(body) is not str or len(body) > 4000 or not re.fullmatch(r"-?[0-9]+", body):
            raise WireError("bad int")
        return int(body)
    if tag == "f":
        return _float(body)
    if tag == "c":
        if type(body) is not list or len(body) != 2:
            raise WireError("bad complex")
        return complex(_float(body[0]), _float(body[1]))
    if tag == "b":
        if type(body) is not str:
            raise WireError("bad bytes")
        try:
            return bytes.fromhex(body)
        except ValueError:
            raise WireError("bad bytes") from None
    if type(body) is not list:
        raise WireError("malformed %r" % tag)
    if tag == "t":
        return tuple(decode(v, depth + 1) for v in body)
    if tag in ("s", "fs"):
        items = [decode(v, depth + 1) for v in body]
        try:
            return set(items) if tag == "s" else frozenset(items)
        except TypeError:
            raise WireError("unhashable set item") from None
    if tag == "d":
        out = {}
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise WireError("bad dict item")
            try:
                out[decode(pair[0], depth + 1)] = decode(pair[1], depth + 1)
            except TypeError:
                raise WireError("unhashable dict key") from None
        return out
    raise WireError("unknown tag %r" % tag)


def dumps(message):
    """One message as a line of JSON (NaN and infinities travel inside float tags)."""
    return (json.dumps(message, allow_nan=False, separators=(",", ":")) + "\n").encode()


def loads(line):
    """Parse one message line; WireError on anything malformed."""
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        raise WireError("malformed message") from None

