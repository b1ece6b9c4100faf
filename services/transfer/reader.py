"""An imported file read in a child process (`python -m services.transfer.reader`), at a lower CPU
priority: the app's process shares neither its interpreter lock nor its memory with the read.

In a thread of the app, reading a 12 MB file took the interpreter lock from the event loop for
seconds (another person's answer streamed at less than half its pace) and left the app's heap
holding what the read had freed (about 10 times the file). The child gets the file on stdin and
the limits as its argument, and writes back, pickled, what `read_import` kept or its refusal's
sentence; it exits when done, its memory with it, and is killed when the import is cancelled
(Stop) or runs past READ_TIMEOUT_SECONDS. What it writes back is within the storage caps; it is
unpickled in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import pickle
import sys
from pathlib import Path

from services.transfer.archive import BadImport, ImportLimits
from services.transfer.reading import ImportRead, read_import

CHILD_NICENESS = 10  # the read takes the CPU only when the chat and the engine do not need it
READ_TIMEOUT_SECONDS = 300.0  # a file within IMPORT_MAX_BYTES takes seconds; this is a machine in trouble
APP_FOLDER = Path(__file__).resolve().parents[2]  # where `services` is found


class ReaderFailed(RuntimeError):
    """The child ended without an answer (a crash, a kill): not the file's fault."""


async def read_in_child(data: bytes, limits: ImportLimits) -> ImportRead:
    """What `read_import(data, limits)` gives, read by a child process; BadImport as it would raise."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", __name__, json.dumps(dataclasses.asdict(limits)),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        cwd=APP_FOLDER,
    )  # fmt: skip
    try:
        output, errors = await asyncio.wait_for(process.communicate(data), READ_TIMEOUT_SECONDS)
    except BaseException:  # cancelled (Stop) or too slow: the read ends with its import
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await asyncio.shield(process.wait())
        raise
    if process.returncode != 0 or not output:
        last = errors.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise ReaderFailed(f"the import's reader exited with {process.returncode}: {last[0][:300]}")
    kind, value = await asyncio.to_thread(pickle.loads, output)
    if kind == "refused":
        raise BadImport(value)
    return value


def main() -> None:
    """The child: the limits from the argument, the file from stdin, the answer to stdout."""
    os.nice(CHILD_NICENESS)
    limits = ImportLimits(**json.loads(sys.argv[1]))
    data = sys.stdin.buffer.read()
    try:
        answer: tuple[str, object] = ("read", read_import(data, limits))
    except BadImport as refused:
        answer = ("refused", str(refused))
    sys.stdout.buffer.write(pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL))


if __name__ == "__main__":
    main()
