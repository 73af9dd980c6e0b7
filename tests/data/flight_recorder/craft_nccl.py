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
        self.frames = True

    def call(self, group, op, ins, outs, state, line, *, retired=None, dtype="Float", coalesced_with=None,
             p2p=None, same_p2p=False):
        """One entry; `coalesced_with` reuses the seq of the previous call on the group (NCCL's slow path), and
        `same_p2p` the p2p_seq_id of the previous p2p op (the ops of one batch_isend_irecv)."""
        if p2p is not None and not same_p2p:
            self.p2p[group] += 1
        elif p2p is None and coalesced_with is None:
            self.counts[group] += 1
        seq = self.counts[group]
        record_id = len(self.entries)
        created = T0 + record_id * 2_000_000 + self.rank * 1000
        started = created + 50_000 if state in ("started", "completed") else None
        completed = created + 900_000 if state == "completed" else None
        desc = self.groups[group][0]
        entry = {
            "record_id": record_id, "pg_id": self.pg_id[group], "process_group": (group, desc),
            "collective_seq_id": seq, "p2p_seq_id": self.p2p[group], "op_id": record_id + 1,
            "profiling_name": f"nccl:{op}" + (f" {p2p}" if p2p else ""), "time_created_ns": created,
            "input_sizes": ins, "input_dtypes": [dtype] * len(ins), "output_sizes": outs,
            "output_dtypes": [dtype] * len(outs), "state": state, "time_discovered_started_ns": started,
            "time_discovered_completed_ns": completed,
            "retired": state == "completed" if retired is None else retired,
            "timeout_ms": 600000, "is_p2p": p2p is not None, "thread_id": "140001", "thread_name": "pt_main_thread",
        }
        if state == "completed":
            entry["duration_ms"] = 0.85  # FlightRecorderDetail.hpp writes it only once it is known
        if self.frames:  # absent when the dump was asked for without stack traces
            entry["frames"] = [{"name": op.lstrip("_"), "filename": "/usr/lib/python3/site-packages/torch/distributed/"
                                "distributed_c10d.py", "line": 3245},
                               {"name": "train_step", "filename": SCRIPT, "line": line},
                               {"name": "<module>", "filename": SCRIPT, "line": 90}]
        self.entries.append(entry)

    def batch(self, group, ops, state, line):
        """batch_isend_irecv: its ops share one p2p_seq_id, closed by a "coalesced" entry marked p2p."""
        for index, (op, peer, size) in enumerate(ops):
            self.call(group, op, [[size]], [[size]], state, line, p2p=peer, same_p2p=index > 0)
        self.call(group, "coalesced", [], [], state, line, p2p="", same_p2p=True)

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


def new_groups(world, made):
    """Groups made with new_group (no bound device: sequential names), `made` = [(desc, members), ...] in the
    order every rank made them; each rank's pg_config lists the ones it is a member of."""
    out = {r: {"0": ("default_pg", list(range(world)))} for r in range(world)}
    for index, (desc, members) in enumerate(made, start=1):
        for r in members:
            out[r][str(index)] = (desc, members)
    return out


def nccl_pipeline_recv_skipped(out):
    """Two pipeline stages of two ranks (a 2 x 2 (pp, dp) mesh made with new_group: pp groups [0, 2] and [1, 3],
    dp groups [0, 1] and [2, 3]). Each of three steps: stage 0 sends its activations to its stage-1 peer on the pp
    group, stage 1 receives them, then every rank all_reduces on dp; a barrier ends the job. Rank 3 skips its
    receive in step 2, so its step-3 receive takes rank 1's step-2 send, and rank 1's third send never finds a
    receive: rank 1 is held in it (started), its dp all_reduce and the barrier queued behind (scheduled); rank
    0 waits in dp #3 for rank 1; ranks 2 and 3 wait in the barrier. Rank 2 dumped without stack frames."""
    groups = new_groups(4, [("mesh_pp", [0, 2]), ("mesh_pp", [1, 3]), ("mesh_dp", [0, 1]), ("mesh_dp", [2, 3])])
    act = [[4, 1024]]
    ranks = {r: Rank(r, groups[r]) for r in range(4)}
    ranks[2].frames = False
    pp = {0: "1", 2: "1", 1: "2", 3: "2"}
    dp = {0: "3", 1: "3", 2: "4", 3: "4"}
    for r in (0, 2):
        rank = ranks[r]
        for step in range(3):
            if r == 0:
                rank.call(pp[r], "send", act, act, "completed", 31, p2p="0->1")
            else:
                rank.call(pp[r], "recv", act, act, "completed", 33, p2p="1<-0")
            rank.call(dp[r], "all_reduce", [[1024]], [[1024]], "started" if (r, step) == (0, 2) else "completed", 35)
        rank.call("0", "all_reduce_barrier", [[1]], [[1]], "scheduled" if r == 0 else "started", 37)
    one, three = ranks[1], ranks[3]
    for step, state in enumerate(("completed", "completed", "started")):
        one.call(pp[1], "send", act, act, state, 31, p2p="0->1")
        one.call(dp[1], "all_reduce", [[1024]], [[1024]], "completed" if step < 2 else "scheduled", 35)
    one.call("0", "all_reduce_barrier", [[1]], [[1]], "scheduled", 37)
    for step in range(3):
        if step != 1:
            three.call(pp[3], "recv", act, act, "completed", 33, p2p="1<-0")
        three.call(dp[3], "all_reduce", [[1024]], [[1024]], "completed", 35)
    three.call("0", "all_reduce_barrier", [[1]], [[1]], "started", 37)
    for r, rank in ranks.items():
        rank.dump(os.path.join(out, f"nccl_trace_rank_{r}"))


def nccl_ring_batch_straggler(out):
    """Four ranks; each step exchanges around a ring with batch_isend_irecv (send to the next rank, receive from
    the previous: one p2p_seq_id, closed by a "coalesced" entry), then all_gathers two shards with
    all_gather_into_tensor_coalesced on its slow path (two _all_gather_base entries closed by an
    "ALLGATHER_coalesced" marker, one collective_seq_id). Rank 2 stalls before the second step's exchange: its
    ring neighbours 1 and 3 are held in their batches (rank 1's send to 2, rank 3's receive from 2), rank 0
    finished its batch and waits in the all_gather (started)."""
    groups = new_groups(4, [])
    ranks = {r: Rank(r, groups[r]) for r in range(4)}
    for step in range(2):
        for r, rank in ranks.items():
            if r == 2 and step == 1:
                continue
            nxt, prv = (r + 1) % 4, (r - 1) % 4
            held = step == 1 and r in (1, 3)
            rank.batch("0", [("send", f"{r}->{nxt}", 256), ("recv", f"{r}<-{prv}", 256)],
                       "started" if held else "completed", 51)
            state = "completed" if step == 0 else "started" if r == 0 else "scheduled"
            rank.call("0", "_all_gather_base", [[64]], [[256]], state, 53)
            rank.call("0", "_all_gather_base", [[64]], [[256]], state, 53, coalesced_with=True)
            rank.call("0", "ALLGATHER_coalesced", [], [], state, 53, coalesced_with=True)
    for r, rank in ranks.items():
        rank.dump(os.path.join(out, f"nccl_trace_rank_{r}"))


def nccl_skip_group_creation(out):
    """skip_group_creation as NCCL records it: rank 5 skips init_device_mesh (2 x 4, dp and tp, made with new_group:
    sequential names, and NCCL sets a communicator up at its first collective) and goes on to the default group's
    second all_reduce. Ranks 0-3 made their tp all_reduce and wait in that second all_reduce; ranks 4, 6 and 7 are
    held setting up the tp communicator with rank 5, before any entry is recorded: their dumps show the first
    all_reduce and nothing after it. Rank 5 made no group, so its pg_config has the default group only."""
    mesh = [("mesh_dp", [c, 4 + c]) for c in range(4)] + [("mesh_tp", [0, 1, 2, 3]), ("mesh_tp", [4, 5, 6, 7])]
    groups = new_groups(8, mesh)
    groups[5] = {"0": groups[5]["0"]}
    for r in range(8):
        rank = Rank(r, groups[r])
        rank.call("0", "all_reduce", [[4]], [[4]], "completed", 20)
        if r < 4:
            rank.call("5", "all_reduce", [[4]], [[4]], "completed", 23)
        if r < 4 or r == 5:
            rank.call("0", "all_reduce", [[4]], [[4]], "started", 24)
        rank.dump(os.path.join(out, f"nccl_trace_rank_{r}"))


CASES = {"nccl_skip_on_mesh_dim": nccl_skip_on_mesh_dim, "nccl_skip_group_creation": nccl_skip_group_creation, "nccl_size_mismatch_timeout": nccl_size_mismatch_timeout,
         "nccl_pipeline_recv_skipped": nccl_pipeline_recv_skipped, "nccl_ring_batch_straggler": nccl_ring_batch_straggler}

if __name__ == "__main__":
    for name, craft in CASES.items():
        out = os.path.join(HERE, name, "dumps")
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        craft(out)
        print(f"{name}: {len(os.listdir(out))} dumps")
