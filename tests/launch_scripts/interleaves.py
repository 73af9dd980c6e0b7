"""Prints lines in pieces (as print() writes them) while another thread writes whole lines to fd 2 directly, as
C++ code (torch's warnings, NCCL) does."""

import os
import threading


def native_noise() -> None:
    for _ in range(2000):
        os.write(2, b"native line\n")


noise = threading.Thread(target=native_noise)
noise.start()
for i in range(2000):
    print("piece", i, "of", "a", "python", "line", "from", "rank", os.environ["RANK"])
noise.join()
