"""Synthetic gloo-shaped Flight Recorder dumps for worlds too large to run here (64 ranks and up).

Sixty-four real gloo ranks under torchrun need about 64 torch imports (a few GB) on a machine with 2 shared
cores, so larger cases are written by this generator instead. It plays an SPMD program on a row-major mesh
with gloo's semantics (a call blocks its rank until every member of its group has issued it), and writes
what gloo's Flight Recorder writes for each rank, field by field as in the recorded cases here: version
2.10, the empty pg_config gloo dumps carry, group names counted up as new_group makes them (default 0,
then each mesh dim's groups in torch's order), pg_ids counting each rank's own groups, state "scheduled",
`retired` for finished calls, timeout_ms 1800000, and frames with a user line.

`write(directory, shape, names, steps, skip)`: every step all_reduces along each dim in turn; `skip` =
(rank, step, dim) drops one call on one rank. A final barrier on the default group ends the program.
"""

from __future__ import annotations

import itertools
import os
import pickle

T0 = 1_795_000_000_000_000_000
TORCH_FILE = "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
SCRIPT = "/job/train.py"


def dim_groups(shape, dim):
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    others = [range(s) for i, s in enumerate(shape) if i != dim]
    out = []
    for coords in itertools.product(*others):
        full = list(coords)
        full.insert(dim, 0)
        base = sum(c * s for c, s in zip(full, strides))
        out.append([base + j * strides[dim] for j in range(shape[dim])])
    return out


def write(directory, shape=(8, 8), names=("dp", "tp"), steps=3, skip=(13, 1, "tp"), prefix="fr_trace_rank_"):
    world = 1
    for s in shape:
        world *= s
    groups = {"0": ("default_pg", list(range(world)))}  # name -> (desc, members), in creation order
    group_of = {r: {"world": "0"} for r in range(world)}
    count = 1
    for d, name in enumerate(names):
        for members in dim_groups(shape, d):
            groups[str(count)] = (f"mesh_{name}", members)
            for r in members:
                group_of[r][name] = str(count)
            count += 1
    programs = {r: [] for r in range(world)}
    for step in range(steps):
        for d, name in enumerate(names):
            for rank in range(world):
                if (rank, step, name) != tuple(skip):
                    programs[rank].append((name, "all_reduce", 20 + d))
    for rank in range(world):
        programs[rank].append(("world", "barrier", 30))
    issued = {r: [] for r in range(world)}  # (group, seq, op, line) per rank, in order
    done: set = set()  # (group, seq) completed
    position = {r: 0 for r in range(world)}
    counts = {(r, g): 0 for r in range(world) for g in groups}
    progress = True
    while progress:
        progress = False
        for rank in range(world):
            # a rank issues its next call only once its previous one completed (gloo blocks)
            if issued[rank] and (issued[rank][-1][0], issued[rank][-1][1]) not in done:
                continue
            if position[rank] >= len(programs[rank]):
                continue
            dim, op, line = programs[rank][position[rank]]
            group = group_of[rank][dim]
            counts[(rank, group)] += 1
            issued[rank].append((group, counts[(rank, group)], op, line))
            position[rank] += 1
            progress = True
        for group, (_, members) in groups.items():
            for seq in range(1, max(counts[(m, group)] for m in members) + 1):
                if (group, seq) not in done and all(counts[(m, group)] >= seq for m in members):
                    done.add((group, seq))
                    progress = True
    os.makedirs(directory, exist_ok=True)
    for rank in range(world):
        mine = [g for g, (_, members) in groups.items() if rank in members]
        pg_id = {g: i for i, g in enumerate(mine)}
        entries = []
        for record_id, (group, seq, op, line) in enumerate(issued[rank]):
            sizes = [] if op == "barrier" else [[16]]
            entries.append({
                "record_id": record_id, "pg_id": pg_id[group], "process_group": (group, groups[group][0]),
                "thread_name": "python", "thread_id": "139990000000000", "collective_seq_id": seq,
                "p2p_seq_id": 0, "op_id": record_id + 1, "profiling_name": f"gloo:{op}",
                "time_created_ns": T0 + record_id * 1_000_000 + rank, "input_sizes": sizes,
                "input_dtypes": ["Float"] * len(sizes), "output_sizes": sizes,
                "output_dtypes": ["Float"] * len(sizes), "state": "scheduled",
                "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
                "retired": (group, seq) in done, "timeout_ms": 1800000, "is_p2p": False,
                "frames": [{"name": op, "filename": TORCH_FILE, "line": 3245},
                           {"name": "train", "filename": SCRIPT, "line": line},
                           {"name": "<module>", "filename": SCRIPT, "line": 40}]})
        status = {}
        for group in mine:
            seqs = [seq for g, seq, _, _ in issued[rank] if g == group]
            if seqs:
                status[str(pg_id[group])] = {"last_enqueued_collective": max(seqs), "last_started_collective": -1,
                                             "last_completed_collective": max((s for s in seqs if (group, s) in done),
                                                                              default=-1)}
        data = {"version": "2.10", "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}},
                "comm_lib_version": "", "pg_status": status, "entries": entries}
        with open(os.path.join(directory, f"{prefix}{rank}"), "wb") as f:
            pickle.dump(data, f)
    return world
