"""YAML as the user writes it (recipes, sweep files, override values), read strictly: a key given
twice in one mapping is an error at its line, not a silent last-one-wins (PyYAML keeps the last,
so `train:` written twice dropped the first section's options without a word)."""
from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError

from upslope.errors import ConfigError


class DuplicateKeyError(ConstructorError):
    """A mapping names one key twice."""


class StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key repeated in one mapping (`<<` merges may still be overridden)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                earlier = first.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: SafeLoader names it below
                continue
            if earlier is not key_node.start_mark:
                raise DuplicateKeyError(None, None, f"key '{key}' appears twice in one mapping (first at line "
                                        f"{earlier.line + 1}); keep one", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """`text` as YAML, duplicate keys refused (yaml.YAMLError, with its line, like any YAML mistake)."""
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - StrictLoader is a SafeLoader


def parse_value(text: str, where: str) -> Any:
    """A command-line value (`key=VALUE`) as YAML reads it, or the text itself when it is not YAML
    (`Q: {prompt` is a template, not a broken mapping); a mapping naming a key twice is a ConfigError
    naming `where`."""
    try:
        return load_yaml(text) if text != "" else ""
    except DuplicateKeyError as exc:
        raise ConfigError(f"{where}: {exc.problem}") from None
    except yaml.YAMLError:
        return text
