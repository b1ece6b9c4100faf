"""The memory probe's census of live Python objects (standard library only, as the probe).

It costs nothing between snapshots, unlike tracemalloc, and sees what gc tracks
(containers, instances) by type, plus containers reachable from module globals,
where state made before a gc.freeze() lives.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Mapping, MutableMapping
from itertools import islice
from typing import Any

CENSUS_MIN_LENGTH = 200  # containers at least this long are candidates for the census's list
CENSUS_CONTAINERS = 40
CONTAINER_TYPES = (dict, list, set, frozenset, tuple, deque, MutableMapping)  # concrete types first: fast
CENSUS_DEPTH = 3  # module global -> attribute -> attribute: where long-lived singletons keep state


def describe(container: Any) -> str:
    """A short hint of what a container holds: its first keys or items' types and text."""
    items = list(islice(container.items() if isinstance(container, Mapping) else container, 3))
    return "; ".join(repr(item)[:60] for item in items)


def is_container(value: Any) -> bool:
    """What both walks count as a container: the builtin ones, deques and mappings (e.g. caches)."""
    return isinstance(value, CONTAINER_TYPES)


def reachable_containers() -> dict[str, int]:
    """Lengths of the containers reachable from module globals through attributes, by path
    (`module.name.attribute`), at least CENSUS_MIN_LENGTH long. The census's object walk misses
    these when they were made before a gc.freeze() (the app and vLLM freeze their start-up heap)."""
    import types

    skipped = (type, types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType)
    found: dict[str, int] = {}
    seen: set[int] = set()
    level = [(name, module) for name, module in list(sys.modules.items()) if module is not None]
    for depth in range(CENSUS_DEPTH):
        following = []
        for path, holder in level:
            try:
                attributes = list(vars(holder).items())
            except TypeError:  # no __dict__ (slots, builtins)
                continue
            for name, value in attributes:
                if id(value) in seen or isinstance(value, skipped):
                    continue
                seen.add(id(value))
                if is_container(value):
                    try:
                        length = len(value)
                    except Exception:  # a mapping whose __len__ fails is skipped
                        continue
                    if length >= CENSUS_MIN_LENGTH:
                        found[f"{path}.{name}"] = length
                elif depth + 1 < CENSUS_DEPTH and hasattr(value, "__dict__"):
                    following.append((f"{path}.{name}", value))
        level = following
    return found


def census() -> dict[str, Any]:
    """Live objects the garbage collector tracks, by type; the longest containers among them and
    among those reachable from module globals."""
    import gc

    types: dict[str, list[int]] = {}
    longest: list[tuple[int, int, Any]] = []
    for obj in gc.get_objects():
        kind = type(obj)
        entry = types.setdefault(f"{kind.__module__}.{kind.__qualname__}", [0, 0])
        entry[0] += 1
        try:
            entry[1] += sys.getsizeof(obj)
            length = len(obj) if is_container(obj) else 0
        except Exception:  # an object whose __sizeof__ or __len__ fails is counted, not measured
            length = 0
        if length >= CENSUS_MIN_LENGTH:
            longest.append((length, id(obj), obj))
    longest.sort(key=lambda item: -item[0])
    containers = [
        {"id": ident, "type": type(obj).__qualname__, "length": length, "hint": describe(obj)}
        for length, ident, obj in longest[:CENSUS_CONTAINERS]
    ]
    return {"types": types, "containers": containers, "reachable": reachable_containers()}
