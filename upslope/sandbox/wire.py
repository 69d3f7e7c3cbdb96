"""Plain data across the sandbox wall: a tagged JSON form of Python values, rebuilt on the
other side from built-in types only (so no object of the sender's can reach the receiver).

Stdlib only and self-contained: this file's source also runs inside the sandbox (the
server side of a function test) and in the checker process, which imports nothing of
upslope. A value is encoded as a small JSON tree; `decode` accepts exactly the tags below
and raises WireError on anything else (a subclass, an unknown tag, a bad shape).

Replies (sandbox -> checker) are JSON lines, written by `dumps` (no import: the sandboxed
side skips `json`'s start-up cost) and parsed by `loads` (the `json` module) on the
checker's side. Requests (checker -> sandbox) are trusted, so they travel as
length-prefixed `marshal` data (`frame`), which the sandboxed side reads with no import.
"""
import marshal

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
        digits = body[1:] if type(body) is str and body[:1] == "-" else body
        if type(body) is not str or len(body) > 4000 or not (digits.isascii() and digits.isdigit()):
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


_ESCAPES = {i: "\\u%04x" % i for i in range(32)}
_ESCAPES.update({ord('"'): '\\"', ord("\\"): "\\\\"})


def _json(tree, parts):
    t = type(tree)
    if tree is None:
        parts.append("null")
    elif t is bool:
        parts.append("true" if tree else "false")
    elif t is str:
        parts.append('"' + tree.translate(_ESCAPES) + '"')
    elif t is list:
        parts.append("[")
        for i, v in enumerate(tree):
            if i:
                parts.append(",")
            _json(v, parts)
        parts.append("]")
    elif t is dict:
        parts.append("{")
        for i, (k, v) in enumerate(tree.items()):
            if i:
                parts.append(",")
            _json(str(k), parts)
            parts.append(":")
            _json(v, parts)
        parts.append("}")
    else:
        raise WireError("not a message tree: %s" % t.__name__)


def dumps(message):
    """One message (a tree of None, bool, str, list and str-keyed dict) as a line of JSON."""
    parts = []
    _json(message, parts)
    try:
        return ("".join(parts) + "\n").encode()
    except UnicodeEncodeError:  # a lone surrogate in a string
        raise WireError("a string that is not valid Unicode") from None


def loads(line):
    """Parse one JSON message line (the checker's side); WireError on anything malformed."""
    import json

    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        raise WireError("malformed message") from None


def frame(message):
    """A trusted message (checker -> sandbox) as a 4-byte length and marshal data."""
    data = marshal.dumps(message, 2)
    return len(data).to_bytes(4, "big") + data


def read_frame(stream):
    """The next framed message from a binary stream, or None at its end."""
    head = stream.read(4)
    if len(head) < 4:
        return None
    return marshal.loads(stream.read(int.from_bytes(head, "big")))

