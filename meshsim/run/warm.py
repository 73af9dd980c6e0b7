"""Imported last by the forkserver, after torch: freeze what is loaded so forked workers stay warm.

Workers are forked from a server that has torch imported. A garbage collection in a fresh worker would
touch every object it inherited and copy each page (copy-on-write): ~0.5 s per rank and ~100 MB each.
gc.freeze() moves those objects out of the collector's reach.

The forkserver also dies with the controller that started it (PR_SET_PDEATHSIG): workers are its children and
die with it in turn, by the kernel's hand, even while a rank holds the GIL inside a C call.
"""

import gc

from meshsim.run.reaper import die_with_parent

die_with_parent()

gc.collect()
gc.freeze()
