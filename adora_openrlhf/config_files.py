"""Reading a ``--config`` file (YAML or JSON) within bounds, refusing what YAML would silently accept.

:func:`read_config_text` parses with PyYAML's safe loader in two stages: it composes the node graph, checks it,
then builds the Python values.

* **Size.** A file may hold at most ``MAX_FILE_BYTES`` and expand to at most ``MAX_NODES`` values (every
  scalar, list and mapping counted once per place it appears once aliases are followed). Aliases make a small
  file stand for an exponential tree (``&a [lol, lol]``, ``&b [*a, *a]``, ... nine levels: 10^8 values, past
  60 s and 1.3 GB downstream); the count is taken on the graph, one visit per node, so checking costs no more
  than the file's own size. A recursive alias (a list that holds itself) is refused too.
* **Duplicate keys.** YAML (and Python's JSON reader) keep the last of two equal keys in one mapping, so a
  second ``lr:`` silently replaces the first; here it is an error naming both lines. Keys brought in by a
  ``<<:`` merge may be overridden, as YAML intends.

Errors are :class:`~adora_openrlhf.errors.ConfigError` lines naming ``FILE:LINE``.
"""

from __future__ import annotations

from typing import Any

from adora_openrlhf.errors import ConfigError

MAX_FILE_BYTES = 1 << 20  # 1 MiB; a full --print-config is about 6 KB
MAX_NODES = 100_000  # values after aliases are followed; a full --print-config has about 200


def _line(node: Any) -> int:
    return node.start_mark.line + 1


def check_nodes(root: Any, where: str) -> None:
    """ConfigError when the YAML node graph under ``root`` has a mapping with two equal keys, a recursive alias,
    or more than ``MAX_NODES`` values once its aliases are followed."""
    import yaml

    size: dict[int, int] = {}  # id(node) -> values in its expanded tree
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:  # iterative post-order walk: a deeply nested file cannot exhaust the interpreter's stack
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            if isinstance(node, yaml.MappingNode):
                children = [n for pair in node.value for n in pair]
            else:
                children = list(node.value) if isinstance(node, yaml.SequenceNode) else []
            size[key] = 1 + sum(size[id(child)] for child in children)
            if size[key] > MAX_NODES:
                raise ConfigError(
                    f"{where}:{_line(node)}: the file expands to more than {MAX_NODES:,} values once its YAML aliases (*name) are "
                    "followed; write the options out, as --print-config prints them"
                )
            continue
        if key in size:
            continue
        if key in on_path:
            raise ConfigError(
                f"{where}:{_line(node)}: a YAML alias refers to a value that contains it (a recursive structure); write the value out"
            )
        on_path.add(key)
        stack.append((node, True))
        if isinstance(node, yaml.MappingNode):
            _check_duplicate_keys(node, where)
            stack.extend((n, False) for pair in node.value for n in pair)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((n, False) for n in node.value)


def _check_duplicate_keys(node: Any, where: str) -> None:
    import yaml

    first_line: dict[Any, int] = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = (key_node.tag, key_node.value)
        if key in first_line:
            raise ConfigError(
                f"{where}:{_line(key_node)}: duplicate key {key_node.value!r} (first given on line {first_line[key]}); "
                "keep one of them, a second one would silently replace the first"
            )
        first_line[key] = _line(key_node)


def read_config_text(text: str, where: str) -> Any:
    """The values of YAML or JSON ``text`` (``None`` for an empty document), after :func:`check_nodes`.

    ``where`` names the file in errors. A syntax error is a ConfigError ``FILE:LINE: not valid YAML or JSON``.
    """
    import yaml

    if len(text.encode("utf-8", errors="replace")) > MAX_FILE_BYTES:
        raise ConfigError(
            f"{where}: larger than {MAX_FILE_BYTES // 1024} KiB; a config file holds options (as printed by --print-config), not data"
        )
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        check_nodes(root, where)
        return loader.construct_document(root)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{where}{line}: not valid YAML or JSON ({getattr(err, 'problem', None) or err})") from None
    except RecursionError:
        raise ConfigError(
            f"{where}: nested too deeply to read; a config file holds options (as printed by --print-config)"
        ) from None
    finally:
        loader.dispose()
