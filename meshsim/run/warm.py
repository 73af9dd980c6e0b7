"""Imported last by the forkserver, after torch: freeze what is loaded so forked workers stay warm.

Workers are forked from a server that has torch imported. A garbage collection in a fresh worker would
touch every object it inherited and copy each page (copy-on-write): ~0.5 s per rank and ~100 MB each.
gc.freeze() moves those objects out of the collector's reach.
"""

import gc

gc.collect()
gc.freeze()
