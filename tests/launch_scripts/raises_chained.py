"""Rank 1 raises an error whose message spans lines, with a note, while handling another error."""
import os


def load(path):
    try:
        return {}[path]
    except KeyError as exc:
        error = ValueError(f"cannot read {path}\nthe file is truncated at byte 12")
        error.add_note("hint: write it again on rank 0")
        raise error from exc


if os.environ["RANK"] == "1":
    load("checkpoint.pt")
