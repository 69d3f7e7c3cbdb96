"""User reward functions named `package.module:function` or `path/to/file.py:function`."""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable

from upslope.errors import ConfigError


def load_user_function(ref: str, what: str = "reward") -> Callable[..., Any]:
    """Import the function `ref` names; one clear error (naming `what` the function is for) if the module
    or name is missing."""
    if ":" not in ref:
        either = "a registry name or " if what == "reward" else ""
        raise ConfigError(f"{what} '{ref}': expected {either}'module:function' / 'file.py:function'")
    target, _, name = ref.rpartition(":")
    if target.endswith(".py"):
        path = Path(target).expanduser()
        if not path.exists():
            raise ConfigError(f"{what} '{ref}': file {path} not found")
        if not path.is_file():
            raise ConfigError(f"{what} '{ref}': {path} is not a file")
        mod_name = f"upslope_user_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[mod_name] = module
        try:
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        except SyntaxError as exc:
            sys.modules.pop(mod_name, None)
            raise ConfigError(f"{path}:{exc.lineno or 1}: {what} module has a SyntaxError: {exc.msg} "
                              f"({what} '{ref}')") from None
        except (Exception, SystemExit) as exc:
            sys.modules.pop(mod_name, None)
            raise ConfigError(f"{what} '{ref}': importing {path} failed: {type(exc).__name__}: {exc}") from None
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise ConfigError(f"{what} '{ref}': cannot import module '{target}' ({exc})") from None
        except SyntaxError as exc:
            raise ConfigError(f"{exc.filename}:{exc.lineno or 1}: {what} module has a SyntaxError: {exc.msg} "
                              f"({what} '{ref}')") from None
        except (Exception, SystemExit) as exc:
            raise ConfigError(f"{what} '{ref}': importing module '{target}' failed: "
                              f"{type(exc).__name__}: {exc}") from None
    fn = getattr(module, name, None)
    if fn is None or not callable(fn):
        raise ConfigError(f"{what} '{ref}': module has no function '{name}'")
    return fn
