"""Serves one torch module from a mutated copy, in every interpreter a mutant's sweep starts.

`python -m bench mutants` puts this folder first on PYTHONPATH and names the module and the copy in
MESHSIM_MUTANT_MODULE and MESHSIM_MUTANT_FILE. Python imports `sitecustomize` at start-up, before any torch
import, so the sweep's controller, its forkserver and every rank forked from it load the mutant in place of the
installed file: the venv's torch is never written to.
"""

import os
import sys

_MODULE = os.environ.get("MESHSIM_MUTANT_MODULE")
_FILE = os.environ.get("MESHSIM_MUTANT_FILE")

if _MODULE and _FILE:
    import importlib.abc
    import importlib.util

    class _MutantFinder(importlib.abc.MetaPathFinder):
        """Finds the mutated module first; every other import goes on to the usual finders."""

        def find_spec(self, fullname, path=None, target=None):
            if fullname != _MODULE:
                return None
            return importlib.util.spec_from_file_location(fullname, _FILE)

    sys.meta_path.insert(0, _MutantFinder())
