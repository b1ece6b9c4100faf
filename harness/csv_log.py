"""An append-only CSV file that load generators write one row at a time (thread-safe, flushed per row,
so a killed run keeps what it had)."""

from __future__ import annotations

import csv
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class CsvLog:
    """Rows under `header`; does nothing until `open` names a file."""

    def __init__(self, header: Sequence[str]) -> None:
        self.header = list(header)
        self._lock = threading.Lock()
        self._file: Any = None
        self._writer: Any = None

    def open(self, path: str) -> None:
        if not path or self._file is not None:
            return
        new = not Path(path).exists() or Path(path).stat().st_size == 0
        self._file = open(path, "a", newline="")  # noqa: SIM115 (closed by close())
        self._writer = csv.writer(self._file)
        if new:
            self._writer.writerow(self.header)

    def write_row(self, row: Sequence[Any]) -> None:
        with self._lock:
            if self._writer is not None:
                self._writer.writerow(row)
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = self._writer = None
