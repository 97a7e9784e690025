"""The results store: how a results folder is laid out and read
(:mod:`~selbench.store.results`: cell and run records, locks) and the on-disk cache of
backbone outputs (:mod:`~selbench.store.cache`). Files are written atomically through
:mod:`selbench.util.files` (re-exported here).

May import: :mod:`selbench.contract`, :mod:`selbench.util`.
"""

from selbench.store.cache import CacheError, OutputCache, default_cache_dir
from selbench.util.files import WriteError, atomic_path, atomic_write_json, atomic_write_text

__all__ = ["CacheError", "OutputCache", "WriteError", "atomic_path", "atomic_write_json",
           "atomic_write_text", "default_cache_dir"]
