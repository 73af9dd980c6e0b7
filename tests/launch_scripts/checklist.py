"""What the launch scripts that run many checks on every rank share: each check registered by name, its error as
its answer, and every result printed as one JSON line the test reads ("RESULTS {...}")."""

import json
import traceback

import torch.distributed as dist

CHECKS = {}


def check(fn):
    CHECKS[fn.__name__] = fn
    return fn


def raises(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 -- the error is the answer
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def report(trace_chars: int = 900) -> None:
    """Run every check, print the results, and leave the job together."""
    results = {}
    for name, fn in CHECKS.items():
        try:
            results[name] = fn()
        except Exception as exc:  # noqa: BLE001 -- reported per check
            results[name] = f"error: {type(exc).__name__}: {exc} {traceback.format_exc()[-trace_chars:]}"
    print("RESULTS " + json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()
