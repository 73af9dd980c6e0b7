"""Setup functions a hostile user might pass (`--setup hostile:NAME`): each must end the run with exit 2."""


def sleeps_forever():
    import time

    while True:
        time.sleep(1)


def exits():
    import os

    os._exit(0)


def raises():
    raise RuntimeError("setup refuses")
