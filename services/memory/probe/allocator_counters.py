"""Allocator counters for the memory probe: jemalloc's statistics, glibc's malloc totals, pymalloc's arenas.

Standard library only, like the probe (sitecustomize.py) that imports it.
"""

from __future__ import annotations

from typing import Any

JEMALLOC_COUNTERS = (
    "stats.allocated",
    "stats.active",
    "stats.metadata",
    "stats.resident",
    "stats.mapped",
    "stats.retained",
    "stats.arenas.4096.pdirty",
    "stats.arenas.4096.pmuzzy",
)  # 4096 = MALLCTL_ARENAS_ALL: the sum over arenas


def jemalloc_mallctl() -> Any:
    """jemalloc's `mallctl` when jemalloc is this process's malloc, else None."""
    import ctypes

    try:
        return ctypes.CDLL(None).mallctl
    except (OSError, AttributeError):
        return None


def jemalloc_counters() -> dict[str, int]:
    """jemalloc's global statistics (bytes; dirty/muzzy in pages), refreshed; {} without jemalloc."""
    import ctypes

    mallctl = jemalloc_mallctl()
    if mallctl is None:
        return {}
    epoch = ctypes.c_uint64(1)
    mallctl(b"epoch", None, None, ctypes.byref(epoch), ctypes.sizeof(epoch))
    counters = {}
    for name in JEMALLOC_COUNTERS:
        value = ctypes.c_size_t(0)
        size = ctypes.c_size_t(ctypes.sizeof(ctypes.c_size_t))
        if mallctl(name.encode(), ctypes.byref(value), ctypes.byref(size), None, 0) == 0:
            counters["jemalloc." + name.removeprefix("stats.").replace("arenas.4096.", "")] = value.value
    return counters


def glibc_counters() -> dict[str, int]:
    """glibc's malloc totals over all arenas (mallinfo2): bytes in use, free inside the heaps (kept
    until a trim or a free at the heap's top), and in mmapped blocks; {} when unavailable or when
    another malloc (tcmalloc) replaced glibc's."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in (
                "arena",
                "ordblks",
                "smblks",
                "hblks",
                "hblkhd",
                "usmblks",
                "fsmblks",
                "uordblks",
                "fordblks",
                "keepcost",
            )
        ]

    try:
        mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return {}
    mallinfo2.restype = MallInfo2
    info = mallinfo2()
    if not info.arena and not info.hblkhd:
        return {}
    return {
        "glibc.in_use": info.uordblks,
        "glibc.free": info.fordblks,
        "glibc.mmapped": info.hblkhd,
        "glibc.heaps": info.arena,
    }


PYMALLOC_STATS = {  # _PyObject_DebugMallocStats's lines -> counter names
    "# arenas allocated current": "pymalloc.arenas",
    "# arenas highwater mark": "pymalloc.arenas_highwater",
    "# bytes in allocated blocks": "pymalloc.allocated_bytes",
    "# bytes in available blocks": "pymalloc.available_bytes",
}


def pymalloc_counters() -> dict[str, int]:
    """Python's small-object allocator: arenas held (1 MiB each on 3.10+, mmapped outside malloc) and
    the bytes of live and free blocks in them; their gap is fragmentation. {} when unavailable
    (PYTHONMALLOC=malloc, another interpreter)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        stats = ctypes.pythonapi._PyObject_DebugMallocStats
    except (OSError, AttributeError):
        return {}
    libc.open_memstream.restype = ctypes.c_void_p
    libc.open_memstream.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
    libc.fclose.argtypes = libc.free.argtypes = stats.argtypes = [ctypes.c_void_p]
    buffer = ctypes.c_void_p()
    size = ctypes.c_size_t()
    stream = libc.open_memstream(ctypes.byref(buffer), ctypes.byref(size))
    if not stream:
        return {}
    written = stats(stream)  # writes the report to the in-memory stream (the GIL is held)
    libc.fclose(stream)
    text = ctypes.string_at(buffer, size.value).decode("ascii", "replace") if buffer.value else ""
    libc.free(buffer)
    if not written:
        return {}
    counters = {"pymalloc.unused_pool_bytes": 0}  # its line is printed only when there are some
    for row in text.splitlines():
        key, _, value = row.partition("=")
        name = PYMALLOC_STATS.get(key.strip())
        if "unused pools" in key:  # "N unused pools * 16384 bytes"
            name = "pymalloc.unused_pool_bytes"
        if name and value:
            counters[name] = int(value.strip().replace(",", ""))
    return counters
