"""cloudpickle that keeps the user's file names and source lines in worker tracebacks (driver).

A function from the user's script (`__main__`, or a file the CLI loaded) travels to the workers by
value. cloudpickle (>= 3) renames the code of such a function to `<dynamic-code>`, so a worker's
traceback said `File "<dynamic-code>", line 11` with no source line, where torchrun and Ray show
`train.py:11` and the code. `dumps` ships each such code object with its real file name and the
file's text as the driver read it; `restore_code`, run by every worker as it unpickles, puts the name
back and the text into `linecache`, so `traceback` prints the line on every rank, even on a host where
the file does not exist.
"""

from __future__ import annotations

import io
import linecache
import pickle
import types
from typing import Any

import cloudpickle

# The file name a shipped code object carries inside the pickle, until restore_code names it again.
_SHIPPED = "<minitrain-shipped-code>"


def restore_code(code: types.CodeType, filename: str, source: str | None) -> types.CodeType:
    """`code` named `filename` again; `source` (the file's text on the driver) goes into linecache,
    so tracebacks print the line. Called by unpickling, in the worker."""
    if source is not None:
        # mtime None: linecache.checkcache keeps the entry (it cannot be compared with a file).
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return code.replace(co_filename=filename)


class _SourceKeepingPickler(cloudpickle.Pickler):
    def __init__(self, file: io.BytesIO):
        super().__init__(file, protocol=pickle.DEFAULT_PROTOCOL)
        self._sources: dict[str, str | None] = {}  # one str per file: the pickle memo ships it once

    def _source(self, filename: str) -> str | None:
        if filename not in self._sources:
            lines = linecache.getlines(filename)  # a file, or a notebook cell IPython registered
            self._sources[filename] = "".join(lines) if lines else None
        return self._sources[filename]

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is types.CodeType and obj.co_filename != _SHIPPED:
            # The renamed copy is pickled the way cloudpickle pickles code; its inner code objects
            # (nested functions, lambdas) still carry their names and come through here on their own.
            return restore_code, (obj.replace(co_filename=_SHIPPED), obj.co_filename, self._source(obj.co_filename))
        return super().reducer_override(obj)


def dumps(obj: Any) -> bytes:
    """`cloudpickle.dumps(obj)`, except that code pickled by value keeps its file name and source
    (see the module docstring). Loads with plain `cloudpickle.loads` where minitrain is importable."""
    buffer = io.BytesIO()
    _SourceKeepingPickler(buffer).dump(obj)
    return buffer.getvalue()
