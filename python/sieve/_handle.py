"""Handle: a Python object that owns one C handle of the host API and destroys it exactly once
(close(), the end of a `with` block, or garbage collection)."""


class Handle:
    _destroy = None  # the C destroy function, set by each subclass (staticmethod)
    _h = None

    def close(self):
        if self._h:
            self._destroy(self._h)
            self._h = None

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
