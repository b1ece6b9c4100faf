"""The memory probe's census of live Python objects (standard library only, as the probe).

It costs nothing between snapshots, unlike tracemalloc, and sees what gc tracks
(containers, instances) by type, plus containers reachable from module globals,
where state made before a gc.freeze() lives.
"""

from __future__ import annotations

import sys
import warnings
from collections import deque
from collections.abc import Mapping, MutableMapping
from itertools import islice
from typing import Any

CENSUS_MIN_LENGTH = 200  # containers at least this long are candidates for the census's list
CENSUS_CONTAINERS = 40
CONTAINER_TYPES = (dict, list, set, frozenset, tuple, deque)
CENSUS_DEPTH = 3  # module global -> attribute -> attribute: where long-lived singletons keep state
OWNER_MIN_OBJECTS = 10  # owners (and their types) holding fewer objects are summed, not listed


def describe(container: Any) -> str:
    """A short hint of what a container holds: its first keys or items' types and text."""
    items = list(islice(container.items() if isinstance(container, Mapping) else container, 3))
    return "; ".join(repr(item)[:60] for item in items)


def is_container(value: Any) -> bool:
    """What both walks count as a container: the builtin ones, deques and mappings (e.g. caches).
    type(), as a lazy proxy's __class__ may raise; the MRO, as issubclass() with an ABC adds every
    type it is asked about to the ABC's cache (a weakref and a callback each: the probe's own growth)."""
    kind = type(value)
    return issubclass(kind, CONTAINER_TYPES) or MutableMapping in kind.__mro__


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
            except Exception:  # no __dict__ (slots, builtins), or a lazy proxy that cannot resolve
                continue
            for name, value in attributes:
                if id(value) in seen or issubclass(type(value), skipped):
                    continue
                seen.add(id(value))
                if is_container(value):
                    try:
                        length = len(value)
                    except Exception:  # a mapping whose __len__ fails is skipped
                        continue
                    if length >= CENSUS_MIN_LENGTH:
                        found[f"{path}.{name}"] = length
                elif depth + 1 < CENSUS_DEPTH:
                    following.append((f"{path}.{name}", value))
        level = following
    return found


def reachable_objects() -> dict[str, Any]:
    """Every object reachable from module globals, by owner and type: strings, numbers and bytes
    too, which gc does not track, and objects frozen by gc.freeze(). The owner is the module global
    (`module.name`) through which the walk first reached an object, globals defined in their
    module first. What only running code holds is owned by `task:<coroutine>` (asyncio's tasks),
    `loop.<attribute>` (the event loop's transports, handles, timers) or `gc:<type of the root>`.
    A walk over every object: seconds in a large process, and its own memory until it returns."""
    import gc

    modules = [(name, module) for name, module in list(sys.modules.items()) if module is not None]
    module_dicts = {id(vars(module)) for _, module in modules}
    tracked = gc.get_objects()
    tasks = _live_tasks()
    loops = [obj for obj in tracked if _is_event_loop(obj)]
    walk = _OwnerWalk(seen=set(module_dicts), reserved=set(map(id, tasks + loops)))  # own roots, walked later
    globals_ = [
        (f"{name}.{key}", value) for name, module in modules for key, value in list(vars(module).items())
    ]
    defined_here = [(path, value) for path, value in globals_ if _defined_in(value) == path.rsplit(".", 1)[0]]
    internals = (walk, modules, module_dicts, globals_, defined_here, tracked, tasks, loops)
    walk.seen.update(map(id, internals))
    for path, value in defined_here + globals_:
        walk(path, value)
    for task in tasks:  # what only running code holds, by the coroutine that holds it
        walk(f"task:{_coroutine_name(task)}", task)
    for loop in loops:  # transports, handles, timers
        for name, value in list(vars(loop).items()):
            walk(f"loop.{name}", value)
    for obj in tracked:
        if id(obj) not in walk.seen:
            walk(f"gc:{type(obj).__qualname__}", obj)
    return _by_owner(walk.owners)


class _OwnerWalk:
    """Counts, by type under an owner, every object reachable from a root that no earlier root
    reached; `reserved` objects are only counted as roots of their own."""

    def __init__(self, seen: set[int], reserved: set[int]) -> None:
        self.seen = seen
        self.reserved = reserved
        self.owners: dict[str, dict[type, list[int]]] = {}
        self.seen.update(map(id, (self.seen, self.reserved, self.owners)))

    def __call__(self, owner: str, start: Any) -> None:
        import gc
        import types

        counts = self.owners.setdefault(owner, {})
        stack = [start]
        while stack:
            obj = stack.pop()
            if id(obj) in self.seen or (id(obj) in self.reserved and obj is not start):
                continue
            if issubclass(type(obj), types.ModuleType):
                continue
            self.seen.add(id(obj))
            entry = counts.setdefault(type(obj), [0, 0])
            entry[0] += 1
            entry[1] += sys.getsizeof(obj, 0)
            stack.extend(gc.get_referents(obj))
            if issubclass(type(obj), dict):  # gc skips the keys of dicts whose keys are all str
                stack.extend(dict.keys(obj))


def _live_tasks() -> list[Any]:
    """asyncio's tasks of every loop, by coroutine name (a stable order between snapshots)."""
    tasks = sys.modules.get("asyncio.tasks")
    if tasks is None:
        return []
    for _attempt in range(5):  # the loop's thread may add a task while this one copies the set
        try:
            return sorted(list(tasks._all_tasks), key=_coroutine_name)  # a WeakSet: not a root
        except RuntimeError:
            continue
    return []


def _coroutine_name(task: Any) -> str:
    coroutine = task.get_coro()
    return getattr(coroutine, "__qualname__", type(coroutine).__qualname__)


def _is_event_loop(obj: Any) -> bool:
    events = sys.modules.get("asyncio.events")
    return events is not None and issubclass(type(obj), events.AbstractEventLoop)


def _defined_in(value: Any) -> str | None:
    try:
        return getattr(value, "__module__", None)
    except Exception:  # a proxy whose attribute lookup fails
        return None


def _by_owner(owners: dict[str, dict[type, list[int]]]) -> dict[str, Any]:
    """Owners with their object count, bytes and larger types, by name; the rest summed."""
    listed: dict[str, Any] = {}
    rest = [0, 0]
    for owner, counts in owners.items():
        objects, size = sum(n for n, _ in counts.values()), sum(b for _, b in counts.values())
        if objects < OWNER_MIN_OBJECTS:
            rest[0] += objects
            rest[1] += size
            continue
        listed[owner] = {
            "objects": objects,
            "bytes": size,
            "types": {
                f"{kind.__module__}.{kind.__qualname__}": entry
                for kind, entry in counts.items()
                if entry[0] >= OWNER_MIN_OBJECTS
            },
        }
    listed["(owners of fewer objects)"] = {"objects": rest[0], "bytes": rest[1], "types": {}}
    return listed


def census(deep: bool = False) -> dict[str, Any]:
    """Live objects the garbage collector tracks, by type; the longest containers among them and
    among those reachable from module globals; with `deep`, every reachable object by owner."""
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
    with warnings.catch_warnings():  # reading a deprecated global (torch's reduce_op) warns each time
        warnings.simplefilter("ignore")
        found = {"types": types, "containers": containers, "reachable": reachable_containers()}
        if deep:
            found["owners"] = reachable_objects()
    return found
