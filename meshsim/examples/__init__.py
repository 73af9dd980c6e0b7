"""PyTorch's "Getting Started with DeviceMesh" recipe, every example on a simulated 2 hosts x 4 devices cluster.

Run them with `meshsim examples`; the test suite runs them too. Each example runs the recipe's own code on
every rank and is then checked: groups against the reference model, training against single-process
training on the same data.
"""

from .recipe import EXAMPLES, SCRIPT_EXAMPLES, ExampleResult, run_examples

__all__ = ["EXAMPLES", "SCRIPT_EXAMPLES", "ExampleResult", "run_examples"]
