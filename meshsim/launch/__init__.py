"""`meshsim launch`: an unmodified torchrun script on simulated hosts x GPUs, bounded and diagnosed.

options.py reads the command line with torchrun's own parser and maps every flag onto the simulated cluster;
logs.py routes each rank's streams as torchrun's LogsSpecs does; launcher.py runs the script on the process
executor's ranks and judges the run.

    from meshsim import launch
    launch("train.py", "--nnodes", "2", "--nproc-per-node", "4")
"""

import sys
import types
from typing import Any

__all__ = ["launch"]


def launch(*args: Any, **kwargs: Any) -> Any:
    """meshsim.launch.launcher.launch, imported when first called: `meshsim launch -h` stays fast."""
    from .launcher import launch as run

    return run(*args, **kwargs)


class _Callable(types.ModuleType):
    # `meshsim.launch(...)` was a function before this package existed, and users' tests call it so: once the
    # package is imported it shadows that name, so the package itself answers the call.
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return launch(*args, **kwargs)


sys.modules[__name__].__class__ = _Callable
