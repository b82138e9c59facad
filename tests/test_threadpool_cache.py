"""The processes backend finds the BLAS/OpenMP libraries loaded (to limit
their threads before forking) once, and again whenever the dynamic loader
has loaded or unloaded a shared library since: a new one is never missed,
even when another was unloaded meanwhile."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_the_libraries_are_found_again_once_one_is_loaded_or_unloaded():
    # in a process of its own: the test session may have loaded anything
    program = textwrap.dedent("""
        import ctypes, ctypes.util, _ctypes
        from manymodels.engine.backends._process_start import (
            _loader_changes, loaded_threadpools)
        first = loaded_threadpools()
        assert loaded_threadpools() is first  # nothing loaded since: kept
        before = _loader_changes()
        for name in ("gdbm", "bz2", "lzma", "expat", "tinfo", "ffi", "uuid"):
            path = ctypes.util.find_library(name)
            if path:
                library = ctypes.CDLL(path)
                if _loader_changes() != before:
                    break
        else:
            raise SystemExit("no library left to load")
        loaded = loaded_threadpools()
        assert loaded is not first and loaded_threadpools() is loaded
        _ctypes.dlclose(library._handle)  # unloaded: the count of libraries is as before,
        assert _loader_changes()[1] > before[1]  # the loader's counters are not
        assert loaded_threadpools() is not loaded
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
