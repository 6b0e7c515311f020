"""Handle: a Python object that owns one C handle of the host API and destroys it exactly once
(close(), the end of a `with` block, or garbage collection)."""
import sys

from ._capi import lib


class Handle:
    _destroy_name = None  # the C destroy function's name, set by each subclass
    _h = None

    def close(self):
        if self._h:
            getattr(lib, self._destroy_name)(self._h)
            self._h = None

    def __del__(self):
        # At interpreter exit torch may have torn down the CUDA context and streams a session
        # runs on: leave the handle to the process's end rather than destroy it on a dead context.
        if not sys.is_finalizing():
            self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
