"""What torch does differently from one release to the next, named once, each with the releases it holds on.

The model follows the release the ranks run (meshsim.spec.platform.Platform.release): an operation a release
lacks is refused before a run ("needs torch >= 2.10; this is 2.9.1") and never drawn; a behaviour that changed
is predicted as the running release behaves. A torch newer than any meshsim knows gets the newest semantics,
and every report says so (meshsim.core.releases.beyond_known). Each rule was found by running meshsim on each
release (drawn plans, the matrix plans and the scenarios, every difference from the model collected) and is
checked there by `python bench/releases.py matrix` (docs/releases.md).

What torch *chooses* (which placement a sharding strategy propagates) is not a rule here: the judge checks
what torch must do, and reports a choice other than the model's as a change (meshsim.model.choices).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.releases import Release, text
from ..spec.platform import Platform


@dataclass(frozen=True)
class Rule:
    id: str
    says: str  # what torch does where the rule holds
    since: Release | None = None  # the first release it holds on (None: every release meshsim knows)
    until: Release | None = None  # the first release it no longer holds on (None: still holds)

    def holds(self, release: Release) -> bool:
        return (self.since is None or release >= self.since) and (self.until is None or release < self.until)

    def releases(self) -> str:
        low = f">= {text(self.since)}" if self.since else ""
        high = f"< {text(self.until)}" if self.until else ""
        return ", ".join(part for part in (low, high) if part) or "every release"


RULES: dict[str, Rule] = {r.id: r for r in (
    Rule("mesh-layout", "DeviceMesh rests on _MeshLayout: _unflatten, _concatenate, _get_all_submeshes and the "
         "layout algebra exist, and a slice's order is its layout's; before, 2.9 ordered a slice by its names' dims "
         "(a flattened name at its last root dim), refusing dims of size 1 out of order with KeyError \"Invalid "
         "mesh_dim_names\"", since=(2, 10, 0)),
    Rule("world-dim-default-group", "every mesh dim that spans the world uses the default group; before, only a "
         "1-D mesh's did (a world-wide dim of a mesh with more dims, [8, 1], got a group of its own)",
         since=(2, 10, 0)),
    Rule("size-from-layout", "DeviceMesh.size(dim) reads the layout (flat-layout says what a dim out of range "
         "raises; a name: TypeError); before, the mesh tensor's size: IndexError \"Dimension out of range ...\", a "
         "name RuntimeError \"Name ... not found\"", since=(2, 10, 0)),
    Rule("slice-overlap-error", "slicing a dim twice raises RuntimeError \"Slicing overlapping dim_names\"; "
         "before, KeyError \"Invalid mesh_dim_names\"", since=(2, 10, 0)),
    Rule("flatten-clash-valueerror", "flattening under a root dim's name raises ValueError; before, RuntimeError",
         since=(2, 10, 0)),
    Rule("flatten-by-layout", "_flatten reads the layout: a 1-D mesh flattened under its own name is itself, a name "
         "flattened before with another layout is refused; before, names alone decided (the first mesh of a name "
         "came back; a 1-D mesh's own name was a clash; a mesh with a dim the root does not have, as a flattened "
         "one, raised ValueError \"not in tuple\"; a rank outside the mesh failed: finding "
         "flatten-outside-the-mesh-fails)", since=(2, 10, 0)),
    Rule("distribute-partial", "distribute_tensor places a Partial (the value on one rank, zeros elsewhere); "
         "before, \"unsupported placements\"", since=(2, 10, 0)),
    Rule("redistribute-keeps-partial", "redistribute to a Partial a dim already has is legal; before, any Partial "
         "target raised \"Can not redistribute to Partial\"", since=(2, 10, 0)),
    Rule("redistribute-comms", "a redistribute issues one collective per transform of torch's greedy plan "
         "(generate_greedy_transform_infos, runs merged onto a flattened mesh), as the model counts them; before, "
         "other counts (a full_tensor of two shards of one tensor dim gathered twice): the process tier counts a "
         "step's collectives where this holds", since=(2, 11, 0)),
    Rule("shard-dim-normalized", "a Shard dim still negative once distribute_tensor adds the tensor's ndim (a dim "
         "before the front) raises AssertionError \"must be normalized\" on every rank, members of the mesh or "
         "not (DTensorSpec's shard order); before, 2.9 took it as Shard(-1)", since=(2, 10, 0)),
    Rule("slice-outside-the-mesh", "a rank outside a mesh of two dims or more slices it (a submesh with no groups "
         "there); before, 2.9 and 2.10 raised IndexError on that rank, indexing its empty list of dim groups",
         since=(2, 11, 0)),
    Rule("pad-empty-dims", "DTensor's zero padding of a short shard (F.pad) keeps a size-0 dim after the padded "
         "one; before, 2.9 raised RuntimeError \"The input size 0, plus negative padding 0 and 0 resulted in a "
         "negative output size\" where it pads such a tensor: a distribute_tensor on the members, and the gather, "
         "all_to_all or reduce_scatter of a redistribute on the members whose shard is short there (their peers "
         "wait in that collective: a hang). 2.9's draws make no tensor with a size-0 dim; the shards of small "
         "tensors have them", since=(2, 10, 0)),
    Rule("mixed-partials-refused", "placements that mix Partial reduce ops (other than sum with avg) raise "
         "\"Mixed Partial reduce types are not supported\"; before, they were taken", since=(2, 11, 0)),
    Rule("gather-narrows", "Shard -> Replicate refuses a gather of another size than the logical one (from_local "
         "given a global shape its shards do not add up to), after the collective, on every member: RuntimeError "
         "\"Expected cond to be True\" where it is shorter, \"narrow unexpectedly changed concrete size\" where "
         "longer; before, it kept what the gather brought", since=(2, 12, 0)),
    Rule("gather-unpad-copies", "Shard -> Replicate copies the unpadded gather (contiguous); before, a view "
         "(finding dtensor-local-not-contiguous)", since=(2, 13, 0)),
    Rule("sum-reduces-other-partials", "torch.sum reduces a Partial of another op before it sums; before, it "
         "summed the partial values (finding dtensor-sum-linear-over-other-partials)", since=(2, 10, 0)),
    Rule("unflatten-by-name", "_unflatten takes its dim by name; before, 2.10 and 2.11 refused every name the mesh "
         "has, an inverted check (finding unflatten-name-check-inverted)", since=(2, 12, 0)),
    Rule("flat-layout", "_FlatLayout, the layout of one mesh dim (canonical modes, complement, orthogonality), "
         "exists, and a _MeshLayout is a tuple of them (DeviceMesh.size of a dim out of range: IndexError \"tuple "
         "index out of range\"); before, _MeshLayout alone (\"Dim 2 is out of range for layout with 2 "
         "dimensions...\")", since=(2, 13, 0)),
    Rule("concatenate-orthogonal", "_concatenate refuses meshes whose dims interleave (check_orthogonal); before, "
         "only meshes that repeat a rank, and one reaching past the rank map failed an assertion", since=(2, 13, 0)),
    Rule("sharding-errors-unwrapped", "an exception inside a sharding strategy reaches the caller as raised; "
         "before, as RuntimeError \"Sharding propagation failed for Op(...)\"", since=(2, 10, 0)),
    Rule("mesh-rank-keyword", "DeviceMesh(..., _rank=r) builds a mesh as rank r sees it", since=(2, 10, 0)),
    Rule("shard-to-partial", "redistribute takes Shard -> Partial(sum) (the shard, zero elsewhere); before, "
         "\"redistributing to Partial is for internal use only\"", since=(2, 14, 0)),
    Rule("sum-prices-every-strategy", "torch.sum prices a move for any placement but Replicate: on a mesh of an "
         "indexed device type (\"cpu:0\") a sum of a Shard or Partial(sum) fails on the mesh's members (finding "
         "dtensor-indexed-device-type); before, only a Partial of another op was moved, so only it failed",
         since=(2, 14, 0)),
    Rule("preserve-rank-order", "DeviceMesh(..., preserve_rank_order=True) keeps each dim's group in mesh order, "
         "so the group rank is the mesh coordinate; the meshes derived from it inherit it", since=(2, 15, 0)),
    Rule("mesh-abort", "DeviceMesh.abort() aborts a root mesh's process groups", since=(2, 15, 0)),
)}


def holds(rule: str, on: Platform | Release) -> bool:
    """Whether `rule` holds on a platform's torch (or a release)."""
    if isinstance(on, Platform):
        forced = dict(on.forced)
        return forced[rule] if rule in forced else RULES[rule].holds(on.release)
    return RULES[rule].holds(on)


def needs(rule: str, on: Platform | Release) -> str | None:
    """Why a release cannot run what needs `rule` ("needs torch >= 2.10; this is 2.9.1"), or None when it can."""
    found = RULES[rule]
    if holds(rule, on):
        return None
    release = on.release if isinstance(on, Platform) else on
    if found.since is not None and release < found.since:
        wanted = f">= {text(found.since)}"
    else:
        wanted = f"< {text(found.until or release)}"
    return f"needs torch {wanted}; this is {text(release)} ({found.says.split(':')[0]})"


def rules_markdown() -> str:
    """The rules as the table docs/releases.md embeds (a test keeps the two equal)."""
    rows = [f"| `{r.id}` | {r.releases()} | {r.says} |" for r in RULES.values()]
    return "\n".join(["| rule | holds on | what torch does there |", "| --- | --- | --- |", *rows])
