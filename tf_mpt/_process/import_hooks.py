"""Run a function right after a module finishes importing (no TensorFlow import).

The start-up hook uses it to enable tf_mpt once `import tensorflow` is done, and the
automatic path to set Keras's (or tf_keras's) policy and patch its optimizers once the
script imports it after tf_mpt was enabled.
"""

import importlib.abc
import importlib.util
import sys

__all__ = ["AfterImport"]


class AfterImport(importlib.abc.MetaPathFinder):
    """A sys.meta_path finder: `callback(name)` runs right after each of `names` (and, with
    `prefix`, each module whose name starts with it) finishes its first import, and
    `before(name)`, where given, as each of `names` starts it; the finder steps aside once
    all of `names` are imported (never, with a prefix: remove() it)."""

    def __init__(self, names, callback, prefix=None, before=None):
        self.names = tuple(names)
        self._prefix = prefix
        self._callback = callback
        self._before = before  # before(name): once, as one of `names` starts importing
        self._started = set()
        self._searching = False

    def install(self):
        sys.meta_path.insert(0, self)
        return self

    def remove(self):
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(self, name, path=None, target=None):
        watched = name in self.names or (self._prefix is not None
                                         and name.startswith(self._prefix))
        if not watched or self._searching:
            return None
        self._searching = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._searching = False
        if spec is None or spec.loader is None:
            return None
        if self._before is not None and name in self.names and name not in self._started:
            self._started.add(name)
            self._before(name)
        spec.loader = _Loader(spec.loader, self, name)
        return spec

    def done(self, name):
        """`name` finished importing."""
        try:
            self._callback(name)
        finally:
            if self._prefix is None and all(m in sys.modules for m in self.names):
                self.remove()


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, finder, name):
        self._inner, self._finder, self._name = inner, finder, name

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        self._finder.done(self._name)

    def __getattr__(self, name):
        return getattr(self._inner, name)
