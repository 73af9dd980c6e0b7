"""meshsim's answer and torch's own analyzer's on every dump set here, as the rows of docs/hangs.md's table:
`python compare.py [CASE...]` from this directory (torch, no GPU; meshsim importable)."""

import os
import sys

from meshsim.core.ranks import ranks_text
from meshsim.replay.analyze import analyze
from meshsim.replay.dumps import read_dir
from meshsim.replay.incident import build
from meshsim.replay.torch_analyzer import run_torch

HERE = os.path.dirname(os.path.abspath(__file__))


def row(case: str) -> str:
    dumps = read_dir(os.path.join(HERE, case, "dumps"))
    incident = build(dumps)
    analysis = analyze(incident)
    torch = run_torch(dumps, incident)
    ours = f"{analysis.culprits} ({analysis.kind})" if analysis.culprits else \
        f"none; candidates {[c.rank for c in analysis.candidates]} ({analysis.kind})"
    as_dumped = "runs" if torch.as_dumped == "ran" else torch.as_dumped.split(":")[0]
    if torch.failed is not None:
        theirs = f"fails ({torch.failed.split(':')[0]})"
    elif torch.culprits:
        theirs = f"culprits {torch.culprits} ({', '.join(k for k in torch.kinds if k != 'missing ranks')})"
    elif torch.missing:
        listed = str(torch.missing) if len(torch.missing) <= 8 else "[" + ranks_text(torch.missing).replace(",", ", ") + "]"
        theirs = f"no culprit; missing ranks {listed}"
    else:
        theirs = "nothing wrong"
    same = "yes" if torch.failed is None and torch.culprits == analysis.culprits else "no"
    if same == "yes" and not analysis.culprits:
        same = "both name none"
    answers = {v for v in torch.by_order.values()}
    order = (f"yes: {len(answers)} answers in {len(torch.by_order)} orders" if torch.order_dependent else "no")
    return f"| `{case}` | {ours} | {as_dumped} | {theirs} | {same} | {order} |"


if __name__ == "__main__":
    cases = sys.argv[1:] or sorted(d for d in os.listdir(HERE) if os.path.isdir(os.path.join(HERE, d, "dumps")))
    print("| case | meshsim | torch's analyzer, as dumped | torch's analyzer, answer | same culprits | "
          "torch's answer depends on file order |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in cases:
        print(row(name), flush=True)
