"""The one culprit rule on records written by hand: what it decides from the calls alone, where the evidence cannot
decide, and when a run that ran out of time was still moving (no hang at all). The hanging scripts and dump sets
(test_launch_hang_scripts.py, test_replay.py) test the same rule on real runs."""

from meshsim.core import pace
from meshsim.core.outcome import KINDS, SLOW, outcome_of
from meshsim.core.record import RankState, RunRecord
from meshsim.core.wire import FINISHED, STUCK, CallBegun, CallReturned
from meshsim.judge.blame import blame


def _rank(rank: int, calls: list[tuple], held: bool = True, created_as: dict[str, str] | None = None) -> RankState:
    """A rank that made `calls` (group, members, line, kind[, root]) in order; the last one it is still in if
    `held`."""
    state = RankState(rank, step=0, op="script")
    state.created_as = dict(created_as or {})
    seqs: dict[str, int] = {}
    for index, (group, members, site, kind, *root) in enumerate(calls):
        seq = seqs.get(group, 0)
        seqs[group] = seq + 1
        state.on_event(CallBegun(kind, members, group, seq, None, site, None, *root))
        if index < len(calls) - 1 or not held:
            state.on_event(CallReturned(time=float(index)))
    state.end = STUCK if held else FINISHED
    state.done = not held
    return state


def _record(states: list[RankState]) -> RunRecord:
    return RunRecord(len(states), 5.0, states, 5.0, True, ended_at=100.0)


def test_two_members_that_disagree_with_no_sibling_to_decide_are_candidates_not_culprits():
    states = [_rank(0, [("0", (0, 1), "a.py:3", "barrier")]), _rank(1, [("0", (0, 1), "a.py:5", "all_reduce")])]
    found = blame(_record(states))
    assert (found.kind, found.culprits) == (KINDS["unknown"], [])
    assert [c.rank for c in found.candidates] == [0, 1] and "cannot decide" in found.note


def test_sibling_pairs_decide_which_member_of_a_pair_departs():
    tp = {"1": "mesh_tp", "2": "mesh_tp", "3": "mesh_tp"}
    states = []
    for group, (a, b) in (("1", (0, 1)), ("2", (2, 3)), ("3", (4, 5))):
        for r in (a, b):
            if r == 4:  # barrier first where every other rank all_reduces first
                states.append(_rank(r, [(group, (a, b), "a.py:7", "barrier")], created_as=tp))
            elif r == 5:
                states.append(_rank(r, [(group, (a, b), "a.py:9", "all_reduce")], created_as=tp))
            else:
                states.append(_rank(r, [(group, (a, b), "a.py:9", "all_reduce"), (group, (a, b), "a.py:10", "barrier")],
                                    held=False, created_as=tp))
    for s in states:
        s.created = {g: m for g, m in (("1", (0, 1)), ("2", (2, 3)), ("3", (4, 5)))}
    found = blame(_record(states))
    assert (found.culprits, found.kind) == ([4], KINDS["reordered"]), found.causes


def test_a_rank_alone_in_one_call_more_than_its_siblings_made_added_it_whoever_waits():
    # (2, 4) dp pairs: two dp all_reduces everywhere, then rank 1 alone makes a third (line 18) and every other rank
    # waits in the world barrier (line 20) for it
    dp = {"1": (0, 4), "2": (1, 5), "3": (2, 6), "4": (3, 7)}
    world = tuple(range(8))
    states = []
    for r in range(8):
        group = next(g for g, m in dp.items() if r in m)
        calls = [(group, dp[group], "t.py:16", "all_reduce")] * 2
        calls += [(group, dp[group], "t.py:18", "all_reduce")] if r == 1 else [("0", world, "t.py:20", "barrier")]
        state = _rank(r, calls, created_as={g: "mesh_dp" for g in dp})
        state.created = dict(dp)
        states.append(state)
    found = blame(_record(states))
    assert (found.culprits, found.kind) == ([1], KINDS["mismatched"]), found.causes
    assert "a line no other rank reached" in found.causes[0].text


def test_the_same_record_gets_the_same_answer_every_time():
    states = [_rank(0, [("0", (0, 1), "a.py:3", "barrier")]), _rank(1, [("0", (0, 1), "a.py:5", "all_reduce")])]
    answers = {repr((b.kind, b.culprits, [c.to_json() for c in b.candidates])) for b in
               (blame(_record(states)) for _ in range(3))}
    assert len(answers) == 1


def _moving(rank: int, last: float, gap: float = 0.01, end: str | None = None) -> RankState:
    state = RankState(rank, end=end)
    state.completed = 200
    state.done_times = [last - gap * i for i in range(pace.KEPT)][::-1]
    return state


def test_a_run_whose_unfinished_ranks_all_still_complete_calls_is_too_slow_not_hung():
    states = [_moving(r, 99.9) for r in range(4)]
    assert pace.still_moving(states, 100.0)
    assert pace.grace(states, 100.0) == pace.MIN_WINDOW_S  # watched a little longer before it is called
    assert outcome_of([None] * 4, hung=True, moving=True) == SLOW


def test_a_rank_that_completed_nothing_lately_makes_the_run_a_hang():
    states = [_moving(r, 99.9) for r in range(3)] + [_moving(3, 90.0)]  # it stopped ten seconds ago
    assert not pace.still_moving(states, 100.0) and pace.grace(states, 100.0) == 0.0


def test_a_rank_that_hung_just_before_the_deadline_is_seen_to_in_the_grace():
    at_deadline = [_moving(r, 99.9) for r in range(3)] + [_moving(3, 99.8)]  # rank 3 has just stopped
    grace = pace.grace(at_deadline, 100.0)
    assert grace > 0  # it looks like the others yet: watch a little longer
    end = 100.0 + grace
    after = [_moving(r, end - 0.01) for r in range(3)] + [_moving(3, 99.8)]  # the others went on; it did not
    assert not pace.still_moving(after, end)


def test_a_rank_that_finished_counts_as_moving_and_one_that_completed_almost_nothing_does_not():
    finished = RankState(0, end=FINISHED, done=True)
    barely = RankState(1, end=STUCK, completed=1, done_times=[99.9])
    assert pace.of_states([finished], 100.0)[0].moving and not pace.of_states([barely], 100.0)[0].moving
    assert not pace.still_moving([finished, barely], 100.0)


def _pair_pipelines(wrong: int) -> list[RankState]:
    """Two 4-stage pipelines (0-3, 4-7) passing activations by broadcasts on pair groups ("p<a>" is (a, a + 1)),
    then a world all_reduce; rank `wrong` (a middle stage) first receives from its next stage, as its source."""
    world = ("w", tuple(range(8)), "a.py:30", "all_reduce")
    states: list[RankState] = []
    for r in range(8):
        stage = r % 4
        if r == wrong:
            calls = [(f"p{r}", (r, r + 1), "a.py:18", "broadcast", r + 1)]
        elif r == wrong + 1:
            calls = [(f"p{r - 1}", (r - 1, r), "a.py:20", "broadcast", r - 1)]
        elif r == wrong - 1:
            calls = [(f"p{r - 1}", (r - 1, r), "a.py:20", "broadcast", r - 1), (f"p{r}", (r, r + 1), "a.py:23",
                                                                                "broadcast", r)]
        else:
            calls = ([(f"p{r - 1}", (r - 1, r), "a.py:20", "broadcast", r - 1)] if stage else []) + \
                    ([(f"p{r}", (r, r + 1), "a.py:23", "broadcast", r)] if stage < 3 else []) + [world]
        states.append(_rank(r, calls))
    return states


def test_a_pipeline_stage_that_calls_on_another_pair_than_its_image_departs_not_the_ranks_it_holds_up():
    # each rank has one image (the other pipeline's same stage): the side whose call never completed departs
    found = blame(_record(_pair_pipelines(wrong=6)))
    assert (found.culprits, found.kind) == ([6], KINDS["mismatched"]), found.causes
    assert "image" in found.causes[0].text and found.causes[0].group == "p6"
    assert set(found.victims) == {0, 1, 2, 3, 4, 5, 7}


def test_positions_in_records_that_lost_their_first_calls_say_nothing_about_images():
    from meshsim.judge.blame.images import image_causes

    states = _pair_pipelines(wrong=2)
    for s in states:  # a ring buffer kept the last calls only: every rank's first call is gone
        s.issued = [(g, q + 1) for g, q in s.issued]
    assert image_causes(states) == {}


def test_a_send_recv_pipeline_stage_that_names_the_wrong_peer_departs_not_the_stage_that_sent_to_it():
    # two 2-stage pipelines (0-1, 2-3) on the world's channels; the last stage sends the loss back to the first;
    # rank 2 receives it from rank 1 (a local index taken for a global rank); then dp all_reduces {0, 2}, {1, 3}
    world = tuple(range(4))
    states = [_rank(0, [("w:0->1", (0, 1), "a.py:5", "send"), ("w:1->0", (0, 1), "a.py:9", "recv"),
                        ("d0", (0, 2), "a.py:12", "all_reduce")]),
              _rank(1, [("w:0->1", (0, 1), "a.py:4", "recv"), ("w:1->0", (0, 1), "a.py:8", "send"),
                        ("d1", (1, 3), "a.py:12", "all_reduce")]),
              _rank(2, [("w:2->3", (2, 3), "a.py:5", "send"), ("w:1->2", (1, 2), "a.py:9", "recv")]),
              _rank(3, [("w:2->3", (2, 3), "a.py:4", "recv"), ("w:3->2", (2, 3), "a.py:8", "send")])]
    assert world
    found = blame(_record(states))
    assert found.culprits == [2], found.causes


def test_a_send_and_a_recv_under_tags_neither_used_before_make_both_ends_candidates():
    # rank 0 sends tag 5, rank 1 receives tag 7: gloo pairs neither; nothing says which tag the program meant
    states = [_rank(0, [("w:0->1 tag 5", (0, 1), "a.py:5", "send")]),
              _rank(1, [("w:0->1 tag 7", (0, 1), "a.py:9", "recv")])]
    found = blame(_record(states))
    assert (found.kind, found.culprits) == (KINDS["unknown"], [])
    assert [c.rank for c in found.candidates] == [0, 1]
    assert all(c.kind == KINDS["tag"] and "tag 5" in c.text and "tag 7" in c.text for c in found.candidates)


def test_the_end_whose_tag_already_carried_a_message_between_the_two_is_the_culprit():
    # forward under tag 1 (0 -> 1), then the reply: rank 1 sends it back under tag 1 again, rank 0 waits for tag 2
    states = [_rank(0, [("w:0->1 tag 1", (0, 1), "a.py:5", "send"), ("w:1->0 tag 2", (0, 1), "a.py:6", "recv")]),
              _rank(1, [("w:0->1 tag 1", (0, 1), "a.py:5", "recv"), ("w:1->0 tag 1", (0, 1), "a.py:8", "send")])]
    found = blame(_record(states))
    assert (found.kind, found.culprits) == (KINDS["tag"], [1]), found.causes


def _stuck_in_no_call(rank: int) -> RankState:
    state = _rank(rank, [("1", (0, 1, 2), "t.py:9", "all_reduce")], held=False)
    state.end, state.done = STUCK, False
    return state


def test_a_rank_held_inside_torchs_distributed_code_out_of_any_call_is_a_candidate_not_a_straggler():
    """DDP broadcasts from C++ when it rebuilds its buckets: a rank held there is in no call meshsim follows, and
    may wait rather than stall. Its peers wait for it in the next all_reduce; the record cannot tell which."""
    waiting = [_rank(r, [("1", (0, 1, 2), "t.py:9", "all_reduce"), ("1", (0, 1, 2), "t.py:9", "all_reduce")])
               for r in (0, 1)]
    stacks = {2: 'Current thread 0x1 (most recent call first):\n  File "/x/torch/nn/parallel/distributed.py", line '
                 '1775 in _pre_forward\n  File "/w/t.py", line 8 in main\n'}
    record = _record([*waiting, _stuck_in_no_call(2)])
    record.stacks = stacks
    found = blame(record)
    assert found.culprits == [] and [c.rank for c in found.candidates] == [2], found.causes
    assert "_pre_forward at distributed.py:1775" in found.candidates[0].text
    record.stacks = {2: stacks[2].replace("/x/torch/nn/parallel/distributed.py", "/w/t.py")}  # the user's own code
    assert blame(record).culprits == [2]
