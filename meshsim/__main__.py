"""`meshsim` and `python -m meshsim`: signals are handled from the first moment, then the CLI is imported."""

import os
import signal
import sys


def _early_exit(signum: int, frame: object) -> None:
    # A signal while meshsim is still importing (torch, rich): nothing is started yet, so one line and out.
    name = "interrupted" if signum == signal.SIGINT else "terminated"
    sys.stderr.write(f"\nmeshsim: {name}; nothing was started\n")
    sys.stderr.flush()
    os._exit(128 + signum)


def entry() -> int:
    signal.signal(signal.SIGINT, _early_exit)
    signal.signal(signal.SIGTERM, _early_exit)
    from .cli import main  # after the handlers: importing takes seconds

    return main()


if __name__ == "__main__":
    sys.exit(entry())
