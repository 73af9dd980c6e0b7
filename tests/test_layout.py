"""The index algebra under the model: layouts, replicas, flatten and unflatten."""

import math

from hypothesis import given
from hypothesis import strategies as st

from meshsim.model import layout as L
from meshsim.sweep.strategies import mesh_shapes


@given(st.integers(1, 64).flatmap(lambda w: mesh_shapes(w, allow_smaller=False)))
def test_row_major_layout_covers_every_position_once_in_order(shape):
    assert L.cell_positions(L.row_major(tuple(shape))) == tuple(range(math.prod(shape)))


@given(st.integers(1, 64).flatmap(lambda w: mesh_shapes(w, allow_smaller=False)), st.data())
def test_replicas_of_any_dim_tile_the_rank_map(shape, data):
    layout = L.row_major(tuple(shape))
    dim = layout[data.draw(st.integers(0, len(shape) - 1))]
    groups = L.dim_groups(dim, tuple(range(math.prod(shape))))
    assert sorted(r for g in groups for r in g) == list(range(math.prod(shape)))
    assert all(len(g) == L.size_of(dim) for g in groups)


@given(st.integers(1, 64).flatmap(lambda w: mesh_shapes(w, allow_smaller=False)))
def test_collapse_of_a_row_major_layout_is_one_contiguous_mode(shape):
    n = math.prod(shape)
    assert L.collapse(L.row_major(tuple(shape))) == (((n, 1),) if n > 1 else ())


@given(st.integers(1, 64).flatmap(lambda w: mesh_shapes(w, allow_smaller=False)), st.data())
def test_unflatten_then_flatten_gives_back_the_dim(shape, data):
    layout = L.row_major(tuple(shape))
    keep = sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1)))
    flat = L.collapse(tuple(layout[i] for i in keep))
    size = L.size_of(flat)
    sizes = data.draw(mesh_shapes(size, allow_smaller=False, max_dims=3))
    try:
        parts = L.split(flat, tuple(sizes))
    except L.LayoutError:
        # Only a dim flattened from non-adjacent dims (several modes) can refuse sizes that cut across them.
        assert len(flat) > 1
        return
    assert L.collapse(parts) == flat
    assert L.sizes_of(parts) == tuple(sizes)


def test_modes_are_canonical_so_equal_dims_compare_equal():
    assert L.canonical(((2, 4), (1, 2), (4, 1))) == ((8, 1),)
    assert L.canonical(((1, 0),)) == ()
    assert L.canonical(((2, 4), (2, 1))) == ((2, 4), (2, 1))


def test_non_adjacent_flatten_enumerates_outer_dim_first():
    dp, _, tp = L.row_major((2, 2, 2))
    assert L.positions(L.collapse((dp, tp))) == (0, 1, 4, 5)
