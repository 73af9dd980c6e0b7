"""Write the NCCL-shaped dumps: `python craft_nccl.py` from this directory (no torch, no GPU).

There is no GPU here, so these are crafted, not recorded. Their shape follows torch's own description of
the format: the keys of FlightRecorder.hpp / FlightRecorderDetail.hpp (version "2.10", comm_lib_version,
pg_config {name: {name, desc, ranks}}, pg_status {pg_id: {last_enqueued_collective, last_started_collective,
last_completed_collective}}, per entry: record_id, pg_id, process_group, collective_seq_id, p2p_seq_id,
op_id, profiling_name "nccl:<op>", time_created_ns, duration_ms, input/output sizes and dtypes, state,
time_discovered_started_ns, time_discovered_completed_ns, retired, timeout_ms, is_p2p, thread_id,
thread_name, frames), the entry states of NCCL ("scheduled", "started", "completed"; retired but not
completed = timed out by the watchdog), the coalesced entries of torch's analyzer tests
(test/distributed/flight_recorder/test_fr_analysis.py: ops sharing one collective_seq_id, closed by a
"nccl:coalesced" entry) and the group names split_group gives in torch 2.13 (a sha1 of the members and the
count of groups, distributed_c10d._hash_ranks_to_str), with each group's members in pg_config.

What NCCL does differently from gloo, and the dumps show: a rank enqueues collectives without waiting for
them, so a rank held up in one has the next ones queued behind it ("scheduled").
"""

import hashlib
import os
import pickle
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
NCCL_VERSION = "2.27.5"
T0 = 1_795_000_000_000_000_000
SCRIPT = "/workspace/train.py"


def split_name(members, groups_so_far):
    """torch 2.13's name for a split_group subgroup."""
    text = "_".join(map(str, members)) + "_" + str(groups_so_far)
    return hashlib.sha1(text.encode()).hexdigest()


class Rank:
    def __init__(self, rank, groups):
        self.rank = rank
        self.groups = groups  # name -> (desc, members), every group this rank belongs to, in creation order
        self.pg_id = {name: i for i, name in enumerate(groups)}
        self.entries = []
        self.counts = {name: 0 for name in groups}
        self.p2p = {name: 0 for name in groups}

    def call(self, group, op, ins, outs, state, line, *, retired=None, dtype="Float", coalesced_with=None,
             p2p=None):
        """One entry; `coalesced_with` reuses the seq of the previous call on the group (NCCL's slow path)."""
        if p2p is not None:
            self.p2p[group] += 1
        elif coalesced_with is None:
            self.counts[group] += 1
        seq = self.counts[group]
        record_id = len(self.entries)
        created = T0 + record_id * 2_000_000 + self.rank * 1000
        started = created + 50_000 if state in ("started", "completed") else None
        completed = created + 900_000 if state == "completed" else None
        desc = self.groups[group][0]
        self.entries.append({
            "record_id": record_id, "pg_id": self.pg_id[group], "process_group": (group, desc),
            "collective_seq_id": seq, "p2p_seq_id": self.p2p[group], "op_id": record_id + 1,
            "profiling_name": f"nccl:{op}" + (f" {p2p}" if p2p else ""), "time_created_ns": created,
            "duration_ms": 0.85 if state == "completed" else None,
            "input_sizes": ins, "input_dtypes": [dtype] * len(ins), "output_sizes": outs,
            "output_dtypes": [dtype] * len(outs), "state": state, "time_discovered_started_ns": started,
            "time_discovered_completed_ns": completed,
            "retired": state == "completed" if retired is None else retired,
            "timeout_ms": 600000, "is_p2p": p2p is not None, "thread_id": "140001", "thread_name": "pt_main_thread",
            "frames": [{"name": op.lstrip("_"), "filename": "/usr/lib/python3/site-packages/torch/distributed/"
                        "distributed_c10d.py", "line": 3245},
                       {"name": "train_step", "filename": SCRIPT, "line": line},
                       {"name": "<module>", "filename": SCRIPT, "line": 90}],
        })

    def dump(self, path):
        status = {}
        for name, pg_id in self.pg_id.items():
            mine = [e for e in self.entries if e["process_group"][0] == name and not e["is_p2p"]]
            if not mine:
                continue
            status[str(pg_id)] = {"last_enqueued_collective": _last(mine, ("scheduled", "started", "completed")),
                                  "last_started_collective": _last(mine, ("started", "completed")),
                                  "last_completed_collective": _last(mine, ("completed",))}
        data = {"version": "2.10", "comm_lib_version": NCCL_VERSION,
                "pg_config": {name: {"name": name, "desc": desc, "ranks": str(list(members))}
                              for name, (desc, members) in self.groups.items()},
                "pg_status": status, "entries": self.entries}
        with open(path, "wb") as f:
            pickle.dump(data, f)


def _last(entries, states):
    return max((e["collective_seq_id"] for e in entries if e["state"] in states), default=-1)


def mesh_groups(shape_names, world=8):
    """A (2, 4) mesh made with split_group: one subgroup a rank per dim, sha1 names."""
    (rows, cols), (outer, inner) = shape_names
    groups = {r: {"0": ("default_pg", list(range(world)))} for r in range(world)}
    for r in range(world):
        row, col = divmod(r, cols)
        outer_members = [col + i * cols for i in range(rows)]
        groups[r][split_name(outer_members, 1)] = (f"mesh_{outer}", outer_members)
        inner_members = [row * cols + j for j in range(cols)]
        groups[r][split_name(inner_members, 2)] = (f"mesh_{inner}", inner_members)
    return groups


def nccl_skip_on_mesh_dim(out):
    """Case (a) as NCCL records it: rank 5 skips the second tp all_reduce of a 2 x 4 (dp, tp) mesh.
    Ranks 4, 6, 7 wait in it (started) with their dp all_reduce and the barrier queued behind (scheduled);
    0, 2, 3 wait in dp for them; 1 and 5 completed dp together and wait in the barrier."""
    groups = mesh_groups(((2, 4), ("dp", "tp")))
    for r in range(8):
        rank = Rank(r, groups[r])
        dp, tp = list(groups[r])[1], list(groups[r])[2]
        four = [[4]]
        rank.call(tp, "all_reduce", four, four, "completed", 21)
        rank.call(dp, "all_reduce", four, four, "completed", 22)
        if r in (4, 6, 7):
            rank.call(tp, "all_reduce", four, four, "started", 21)
            rank.call(dp, "all_reduce", four, four, "scheduled", 22)
            rank.call("0", "all_reduce_barrier", [[1]], [[1]], "scheduled", 23)
        elif r in (0, 2, 3):
            rank.call(tp, "all_reduce", four, four, "completed", 21)
            rank.call(dp, "all_reduce", four, four, "started", 22)
            rank.call("0", "all_reduce_barrier", [[1]], [[1]], "scheduled", 23)
        else:
            if r == 1:
                rank.call(tp, "all_reduce", four, four, "completed", 21)
            rank.call(dp, "all_reduce", four, four, "completed", 22)
            rank.call("0", "all_reduce_barrier", [[1]], [[1]], "started", 23)
        rank.dump(os.path.join(out, f"nccl_trace_rank_{r}"))


def nccl_size_mismatch_timeout(out):
    """HSDP-like steps on a 2 x 4 (replicate, shard) mesh: an all_gather_into_tensor_coalesced on shard (NCCL's
    fast path: one entry), a send/recv pair on the default group, two _reduce_scatter_base coalesced on
    shard (the slow path: two entries and a closing "coalesced", one seq), then a _reduce_scatter_base
    (reduce_scatter_tensor) where rank 6 passes half the elements. That one timed out on ranks 4-7 (the
    watchdog retired it, not completed); their replicate all_reduce is queued behind; ranks 0-3 wait in
    theirs. Rank 2's buffer has dropped its oldest call."""
    groups = mesh_groups(((2, 4), ("replicate", "shard")))
    for r in range(8):
        rank = Rank(r, groups[r])
        rep, shard = list(groups[r])[1], list(groups[r])[2]
        rank.call(shard, "all_gather_into_tensor_coalesced", [[4], [4]], [[16], [16]], "completed", 40)
        if r in (0, 1):
            rank.call("0", "send" if r == 0 else "recv", [[8]], [[8]], "completed", 41,
                      p2p="0->1" if r == 0 else "1<-0")
        rank.call(shard, "_reduce_scatter_base", [[16]], [[4]], "completed", 44)
        rank.call(shard, "_reduce_scatter_base", [[16]], [[4]], "completed", 44, coalesced_with=True)
        rank.call(shard, "coalesced", [], [], "completed", 45, coalesced_with=True)
        if r >= 4:
            size = [[8]] if r == 6 else [[16]]
            rank.call(shard, "_reduce_scatter_base", size, [[size[0][0] // 4]], "started", 52, retired=True)
            rank.call(rep, "all_reduce", [[4]], [[4]], "scheduled", 53)
        else:
            rank.call(shard, "_reduce_scatter_base", [[16]], [[4]], "completed", 52)
            rank.call(rep, "all_reduce", [[4]], [[4]], "started", 53)
        rank.call(rep, "all_reduce", [[4]], [[4]], "scheduled", 54)
        if r == 2:  # a smaller buffer: the oldest entry fell out, and record ids count on from it
            rank.entries = rank.entries[1:]
        rank.dump(os.path.join(out, f"nccl_trace_rank_{r}"))


CASES = {"nccl_skip_on_mesh_dim": nccl_skip_on_mesh_dim, "nccl_size_mismatch_timeout": nccl_size_mismatch_timeout}

if __name__ == "__main__":
    for name, craft in CASES.items():
        out = os.path.join(HERE, name, "dumps")
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        craft(out)
        print(f"{name}: {len(os.listdir(out))} dumps")
