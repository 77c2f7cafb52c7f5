"""The small-groups routes: batches of many small GEMMs (attention heads: 14 x 32 x 14 per
head for MiniLM), the whole batch in a few calls (``_batch_kernels``).

The BLAS route computes a batch pass by pass and tile by tile, with its checks of the codes
and scales and its threads around them, and the window route a work item per group's
columns: for groups of a few hundred outputs those costs exceed the arithmetic.

Exact-tree units of the BLAS route (``datapath.blas``; :func:`small_groups_matmul`): one
kernel call for the batch (``_batch_kernels.exact_groups``, the groups split over the
threads) decodes each group's operands (non-finite codes decode to NaN or ±Inf), forms each
tree's unscaled sums in registers (exact in any order, as the BLAS route's float64 sums are)
and adds them to the group's accumulators with the BLAS route's accumulation steps. The
outputs of rows of A and columns of B holding a NaN or ±Inf element (every term of a sum is
computed, so their sums are the only non-finite ones), with NaN scales or a c that is
non-finite or -0 are flagged for the generic kernel, as are an exact accumulator's sums
wider than two float64s. An exact accumulator's group whose products, by its scales'
spread, one float64 sum holds exactly (``_batch_kernels.one_sum_fits``, the bound by which
the BLAS route sums ranges of blocks in one GEMM) is summed as one tree over all of K, one
step. Trees of several scale blocks (bfp-exact: 16 products over sub-blocks of 2) are
folded first, as the BLAS route folds them: each tree's blocks onto
its least scale, each code raised to index a table of the element values times 2^(its
block's rise), all in one pass over the codes (``_batch_kernels.fold_group_codes``;
``fold_block_pairs`` for whole trees of 8 blocks of 2 over uint16 codes); rows
whose fold would need more than 53 bits are flagged (:func:`_folded_groups`). Each thread
holds one group's decoded operands: groups of up to :data:`GROUPS_DECODED` elements take
the route.

Such units whose tree sums leave float32 room for sub-blocks a binade apart (bfp-exact:
MX9/MX6/MX4 and MX INT8 sums of 20 bits or fewer) take a float32 kernel first
(``_float32_kernels.scaled_float32_groups``, :func:`_float32_plan`): each element decoded
with its own block's scale, each tree's exact sum in float32 fused multiply-adds and the
fp32 accumulation as an IEEE float32 addition, no fold (its module docstring proves when
that is exact; it checks so per group). The groups it leaves (NaN scales, exponents too
far apart within a tree, sums at the edges of float32's range) take the folded route
above. Its groups may be larger: up to :data:`FLOAT32_GROUP_FACTOR` times
:data:`SMALL_GROUP_OUTPUTS` outputs (128-token heads), where its sums in registers outrun
the BLAS route's passes; so may those of units whose trees are 32 float64 sums or an exact
accumulator's blocks of 32 (:func:`_wide_tree_unit`: ocp-exact and kulisch on FP8), which
``exact_groups`` sums two rows of A at a time.

Truncating-window units (``datapath.window``; :func:`window_groups_matmul`): each group's
M x N outputs are SIMD lanes that read the group's decoded rows of A and columns of B in
place (``_batch_kernels.window_groups``), through the window kernels' stages. Wide groups
(128-token heads) loop over a row's lanes at once, the longer side of the group as the
lanes (a group with fewer columns than rows is computed as its transpose, C^T = B A^T).
The kernel is compiled apart for narrow and wide groups, each with only its own stages.

Both take batches of several groups of at most :data:`SMALL_GROUP_OUTPUTS` and
:data:`WINDOW_GROUP_OUTPUTS` outputs each (wider ones through some units:
:func:`small_groups_apply`, :func:`window_groups_apply`), and groups whose operands (exact
units) or products (window units, :data:`WINDOW_GROUP_VALUES`) are few (``datapath.api`` asks for
batches; a single GEMM, and wider or longer groups, keep the per-GEMM routes).

Large GEMMs of units whose trees are 32 float64 sums rounded into the accumulator one by one
(ocp-exact on FP8 E4M3; :func:`exact_tiles_apply`) take the exact kernel too, as batches of
output tiles of :data:`EXACT_TILE` rows (:func:`exact_tiles_matmul`), where its tree sums in
registers outrun the BLAS route's GEMM of depth 32 per tree and its pass over the sums: on
some processors, not others, so the two are raced once per unit and process
(:func:`exact_tiles_outrun_blas`).
"""

from __future__ import annotations

import functools
import time

import numpy as np

from .._threads import SERIAL_GEMM_BELOW, run_in_threads, threads_for
from ..formats import get_format
from . import _batch_kernels as B
from . import _float32_kernels as F
from . import _window_kernels as W
from ..quantize._kernels import SCALE_NAN
from ._blas_kernels import fold_code_blocks
from .blas import (
    DECODED_VALUES,
    _blas_threads,
    blas_matmul,
    blas_route,
    span_bits,
    blocks_per_tree,
    exact_in_float64,
    grid_floor,
    grid_nearest_even_floor,
    grid_rule,
    grid_trees,
    slice_width,
    subnormals_work,
    tree_sum_bits,
)
from .schema import FLOAT32_FORMATS, DatapathParams, route_accepts
from .tables import element_operand
from .window import (
    _offset_tables,
    _window_config,
    in_tree_order,
    tree_order,
    operand_offset,
    product_overflow_possible,
    window_applies,
)

#: Outputs per group (M x N) up to which a batch takes the exact small-groups route:
#: MiniLM's 14 x 14 and 14 x 32 heads do; 128 x 64 heads run faster on the BLAS route's tiles
#: but through the units of :data:`FLOAT32_GROUP_FACTOR`.
SMALL_GROUP_OUTPUTS = 1024
#: Times :data:`SMALL_GROUP_OUTPUTS` the outputs per group up to which a batch of a unit of
#: ``_float32_kernels``' float32 kernel (:func:`_float32_unit`: bfp-exact) or of wide
#: float64 trees (:func:`_wide_tree_unit`) takes the route: 128-token heads (128 x 128,
#: 128 x 64) too, whose tree sums in registers outrun the BLAS route's passes.
FLOAT32_GROUP_FACTOR = 16
#: Positions per tree from which a unit's wider groups take the exact small-groups route
#: (:func:`_wide_tree_unit`): each tree's accumulation step, once per output, is then paid
#: over that many products at least.
WIDE_TREE_TERMS = 32
#: The window units' bound: wider groups take the per-GEMM window route, whose lanes are a
#: group's columns (too few lanes for groups of a few columns).
WINDOW_GROUP_OUTPUTS = 512
#: Wider groups of window units take the small-groups route too where their padded
#: columns reach ``_batch_kernels.ROW_LANES_FROM`` (the kernel's stages then loop over a
#: row's lanes at once), they have at least :data:`WINDOW_WIDE_ROWS` rows and at most
#: :data:`WINDOW_WIDE_OUTPUTS` outputs: 128-token heads (128 x 128 and 128 x 64), whose
#: work items on the per-GEMM route would be a group's 64 or 128 columns. One or two rows
#: of wide groups keep the per-GEMM route (a row pair's lanes are no longer than the
#: per-GEMM route's, which splits a group over the threads).
WINDOW_WIDE_OUTPUTS = 1 << 14
WINDOW_WIDE_ROWS = 16
#: Decoded elements (float64) of one group's A and B, B's columns padded to whole passes of
#: ``_batch_kernels.LANES``, which each thread of the exact small-groups route holds: groups
#: up to this many take it, as the BLAS route bounds its decoded panels.
GROUPS_DECODED = DECODED_VALUES
#: ``exact_groups``' floor of X for units without one: above every scale exponent sum.
NO_FLOOR = 1 << 20
_NONE_FLAGGED = tuple(np.empty(0, dtype=np.intp) for _ in range(3))
#: Rows and columns of a tile of :func:`exact_tiles_matmul` (a group of ``exact_groups``):
#: per pass of columns the kernel reads the tile's rows of A from L2, and 128 rows spread
#: each pass's setup over enough of them.
EXACT_TILE = 128
#: Columns of a tile of :func:`exact_tiles_matmul` where K allows (its decoded A and B within
#: :data:`GROUPS_DECODED`): each decoded row of A then serves twice the columns.
EXACT_WIDE_TILE = 256
#: Columns of the tiles of one batch of :func:`exact_tiles_matmul` at most, and the tiles
#: (EXACT_RUN / EXACT_TILE) of the batches it holds at once: A's panel is copied to each
#: (8 MiB of codes at K = 8192, whose tiles are EXACT_TILE wide).
EXACT_RUN = 8 * EXACT_TILE
#: Products per group (K x M x N) up to which a batch of window units takes the small-groups
#: route, and elements of its tile of B (K x N, N padded to whole blocks of 16 lanes): per
#: thread the kernel holds a group's decoded rows and tile (5 bytes an element) and about 35
#: bytes an output.
WINDOW_GROUP_VALUES = 1 << 18


def small_groups_apply(params: DatapathParams, rows: int, columns: int, length: int) -> bool:
    """Whether a batch of groups of ``rows`` x ``columns`` outputs of ``length`` terms through
    this unit takes the small-groups route: small groups (:data:`SMALL_GROUP_OUTPUTS`, or
    :data:`FLOAT32_GROUP_FACTOR` times that for units of the float32 kernel,
    :func:`_float32_unit`, and of wide float64 trees, :func:`_wide_tree_unit`; one group's
    decoded operands within :data:`GROUPS_DECODED`), the BLAS route's unit checks
    (``blas=`` declarations of the schema, tree sums exact in float64; trees of several
    scale blocks are folded, :func:`_folded_groups`), and subnormals kept by the thread's
    floating point (``blas.subnormals_work``)."""
    return (
        rows * columns <= SMALL_GROUP_OUTPUTS
        or (
            rows * columns <= SMALL_GROUP_OUTPUTS * FLOAT32_GROUP_FACTOR
            and (_float32_unit(params) or _wide_tree_unit(params))
        )
    ) and (
        (rows + -(-columns // B.LANES) * B.LANES) * length <= GROUPS_DECODED
        and _exact_unit(params)
        and subnormals_work()
    )


@functools.lru_cache(maxsize=1024)
def _float32_unit(params: DatapathParams) -> bool:
    """Whether the unit's batches may take ``_float32_kernels.scaled_float32_groups``
    (:func:`_float32_plan`: trees of several scale blocks rounded into the fp32
    accumulator one by one, tree sums with room in float32, element values all finite
    float32s, a float32 c): its groups up to :data:`FLOAT32_GROUP_FACTOR` times
    :data:`SMALL_GROUP_OUTPUTS` outputs then take the small-groups route."""
    if params.c_format not in FLOAT32_FORMATS or blocks_per_tree(params) <= 1:
        return False
    tables = [  # (the kernels' tables; empty for a format decoded from its fields)
        element_operand(get_format(name), params.input_subnormals)[0]
        for name in (params.a_format, params.b_format)
    ]
    if not (tables[0].size and tables[1].size):
        return False
    float32_c = np.zeros((1, 1, 1), dtype=np.float32)
    return _exact_unit(params) and _float32_plan(params, tables, float32_c) is not None


@functools.lru_cache(maxsize=1024)
def _wide_tree_unit(params: DatapathParams) -> bool:
    """Whether the unit's groups up to :data:`FLOAT32_GROUP_FACTOR` times
    :data:`SMALL_GROUP_OUTPUTS` outputs take ``_batch_kernels.exact_groups``: trees of
    :data:`WIDE_TREE_TERMS` positions or more, one scale block each, whose sums the BLAS
    route forms in float64 (wider than float32's 24 bits) or adds to an exact accumulator.
    (The BLAS route's float32 GEMMs of narrower sums into a float32 accumulator, at twice
    float64's rate, outrun the kernel's float64 sums; and on narrower trees the kernel's
    accumulation step, once per tree and output, outweighs its sums: the BLAS route's
    fused trees of 8, ``_tree_kernels.rne_trees8``, outrun it.)"""
    bits = tree_sum_bits(params)
    return (
        blocks_per_tree(params) == 1
        and slice_width(params) >= WIDE_TREE_TERMS
        and bits is not None
        and (bits > 24 or params.accumulator_format == "exact")
    )


@functools.lru_cache(maxsize=1024)
def _exact_unit(params: DatapathParams) -> bool:
    """The unit checks of :func:`small_groups_apply`, once per unit and formats (a model's
    GEMMs ask again and again). The shape bounds are read on every call: tests lower them."""
    return route_accepts("blas", params) and exact_in_float64(params)


def exact_trees(params: DatapathParams, length: int) -> np.ndarray:
    """(T, 3) first position, last position and scale of each tree the BLAS route adds
    for operands of ``length`` elements (a scale block, or for trees of several blocks the
    tree's folded scale: :func:`_folded_groups`' index t), in its order: a grid's
    trees as the kernel cuts them (``blas.grid_trees``), an exact accumulator's block sums,
    else runs of ``fused_terms``, over the operands padded to whole blocks (a tree may reach
    past ``length``: the padding is zeros)."""
    block, width = params.block_size, slice_width(params)
    scaled = params.scales != "none"
    padded_to = block if scaled else width  # blas_matmul's ``block`` with one block per tree
    if params.grid_fraction_bits is not None:
        spans = grid_trees(params, length, block if params.trees_in_blocks else padded_to)
    else:
        padded = -(-length // padded_to) * padded_to
        spans = [(first, first + width) for first in range(0, padded, width)]
    span = block * blocks_per_tree(params)  # the positions of one scale (folded) per tree
    trees = [(first, last, first // span if scaled else 0) for first, last in spans]
    return np.array(trees, dtype=np.int64).reshape(-1, 3)


@functools.lru_cache(maxsize=256)
def _exact_plan(params: DatapathParams, length: int):
    """(trees, mode, floors, grid, choices) of ``_batch_kernels.exact_groups`` for this unit
    and K = ``length``, worked out once per unit and length (the arrays read-only)."""
    grid = choices = np.zeros(3, dtype=np.int64)  # (read only where the mode is GRID)
    floors = [None, None]
    if params.accumulator_format == "exact":
        mode = B.EXACT_ACCUMULATOR
    elif params.grid_fraction_bits is not None:
        mode = B.GRID
        grid, choices = grid_rule(params)
        floors = [grid_nearest_even_floor(params), grid_floor(params)]
    else:
        mode = B.ROUND_EACH_TREE
    floors = np.array([NO_FLOOR if x is None else x for x in floors], dtype=np.int64)
    trees = exact_trees(params, length)
    for array in (trees, floors, grid, choices):
        array.setflags(write=False)  # (kept: every call of the unit and length shares them)
    return trees, mode, floors, grid, choices


def small_groups_matmul(
    params, kernel_args, codes_a, codes_b, scales_a, scales_b, c_values, out, serial: bool = False
):
    """Fill ``out`` (G, M, N uint32 fp32 bits, contiguous) with the BLAS route's outputs of
    the batch A[g] (M, K) times B[g] given as (N, K): codes (G, rows, K) of any unsigned
    dtype, scale exponents (G, rows, blocks) (zeros for a unit without scales), ``c_values``
    (G, M, N) or (1, 1, 1), ``kernel_args`` the generic kernel's, whose first and third are
    the element tables. Returns the (groups, rows, columns) index arrays of the outputs the
    generic kernel must compute (module docstring). The groups are split over the threads
    (:func:`run_groups`; ``serial``: the calling thread alone), each decoding one group at a
    time: by the float32 kernel where :func:`_float32_plan` allows, the groups it leaves
    and other units by :func:`_exact_groups`."""
    tables = kernel_args[0], kernel_args[2]
    if blocks_per_tree(params) > 1 and scales_a.size and scales_b.size:
        plan = _float32_plan(params, tables, c_values)
        if plan is not None:
            operands = (codes_a, codes_b, scales_a, scales_b, c_values)
            return _float32_groups(params, plan, kernel_args, operands, out, serial)
    return _exact_groups(
        params, kernel_args, codes_a, codes_b, scales_a, scales_b, c_values, out, serial
    )


def _exact_groups(
    params, kernel_args, codes_a, codes_b, scales_a, scales_b, c_values, out, serial: bool
):
    """:func:`small_groups_matmul` by ``_batch_kernels.exact_groups``, trees of several
    scale blocks folded first (:func:`_folded_groups`)."""
    arguments, flags = _exact_arguments(
        params, kernel_args, codes_a, codes_b, scales_a, scales_b, c_values, out
    )
    flagged = run_groups(B.exact_groups, arguments, codes_a.shape[0], serial)
    return np.nonzero(flags) if any(flagged) else _NONE_FLAGGED


def _exact_arguments(params, kernel_args, codes_a, codes_b, scales_a, scales_b, c_values, out):
    """(the arguments of ``_batch_kernels.exact_groups`` but its groups, its flags array) for
    a batch of :func:`_exact_groups`."""
    groups, _, length = codes_a.shape
    trees, mode, floors, grid, choices = _exact_plan(params, length)
    tables = kernel_args[0], kernel_args[2]
    if blocks_per_tree(params) > 1 and scales_a.size and scales_b.size:
        codes_a, codes_b, scales_a, scales_b, tables = _folded_groups(
            params, tables, codes_a, codes_b, scales_a, scales_b, trees.shape[0]
        )
    flags = np.empty(out.shape, dtype=np.uint8)
    room = 53 - tree_sum_bits(params) if mode == B.EXACT_ACCUMULATOR and len(trees) > 1 else -1
    arguments = (
        codes_a,
        codes_b,
        scales_a,
        scales_b,
        c_values,
        *tables,
        trees,
        mode,
        floors,
        grid,
        choices,
        room,
        out,
        flags,
    )
    return arguments, flags


def exact_tiles_apply(params: DatapathParams, rows: int, columns: int, length: int) -> bool:
    """Whether GEMMs of ``rows`` x ``columns`` outputs of ``length`` terms through this unit
    take :func:`exact_tiles_matmul`: units whose every tree is rounded into the accumulator
    (no grid, no exact accumulator) and whose trees are :data:`WIDE_TREE_TERMS` or more
    float64 sums of one scale block (:func:`_wide_tree_unit`: ocp-exact on FP8), at least
    :data:`EXACT_TILE` rows and columns, and K short enough for a tile's decoded operands
    (:data:`GROUPS_DECODED`). There ``_batch_kernels.exact_groups``' sums in registers may
    outrun the BLAS route's GEMM of depth 32 per tree and its pass over the sums; whether
    they do on this processor is :func:`exact_tiles_outrun_blas`'s."""
    return (
        min(rows, columns) >= EXACT_TILE
        and 2 * EXACT_TILE * length <= GROUPS_DECODED
        and _exact_unit(params)
        and _wide_tree_unit(params)
        and _exact_plan(params, length)[1] == B.ROUND_EACH_TREE
        and subnormals_work()
    )


#: Rows, columns and terms of the GEMM on which :func:`exact_tiles_outrun_blas` races the
#: two routes (67 M products, whole tiles of both: about 6 ms a run), and the rounds of each.
RACE_SHAPE = (2 * EXACT_TILE, EXACT_WIDE_TILE, 1024)
RACE_ROUNDS = 3
_RACED: dict = {}  # params -> whether the tiles won


def exact_tiles_outrun_blas(params: DatapathParams, kernel_args) -> bool:
    """Whether :func:`exact_tiles_matmul` outruns the BLAS route (``blas.blas_matmul``) on
    this processor for this unit (one of :func:`exact_tiles_apply`'s): raced once per unit
    and process, the answer kept. Both give the same bits (every output is its own exact
    dot product), so only their speed differs, and that with the processor: the tiles' tree
    sums run in SIMD registers as wide as the compiler's tuning for the processor picks
    (256 bits on Intel's AVX-512 cores), the BLAS route's in the BLAS library's GEMM at the
    processor's full width, plus a pass over the sums per tree (the tiles won on an AMD Zen
    4 core, about 1.2x the BLAS route's speed at 1024^3; on an Intel Xeon with AVX-512 they
    ran at 0.7-0.85x its speed). The race: a GEMM of :data:`RACE_SHAPE` (rows, columns, K)
    of random finite codes of the unit's formats and scale exponents in [-4, 4], each route
    run once to warm up (a first use compiles or loads its kernels) and then
    :data:`RACE_ROUNDS` times in turn, on this thread alone (``time.thread_time``: its CPU
    time, which other processes' load leaves alone), the best of each compared; the BLAS
    library held to one thread (``blas._blas_threads``). Without threadpoolctl to hold it
    there (the ``blas`` extra) no race is run: the tiles, whose threads are mxsim's."""
    if _blas_threads() is None:
        return True
    won = _RACED.get(params)
    if won is None:
        won = _RACED[params] = _race_tiles(params, kernel_args)
    return won


def _race_tiles(params: DatapathParams, kernel_args) -> bool:
    """:func:`exact_tiles_outrun_blas`'s race, run."""
    rng = np.random.default_rng(0)
    rows, columns, length = RACE_SHAPE
    codes, scales = [], []
    for table, count in ((kernel_args[0], rows), (kernel_args[2], columns)):
        finite = np.flatnonzero(np.isfinite(table))
        codes.append(
            rng.choice(finite, (1, count, length)).astype(np.min_scalar_type(table.size - 1))
        )
        scales.append(rng.integers(-4, 5, (1, count, length // params.block_size), np.int32))
    operands = (*codes, *scales, np.zeros((1, 1, 1), dtype=np.float32))
    out = np.empty((1, rows, columns), dtype=np.uint32)  # (the fp32 accumulator's bits)
    route = blas_route(params, kernel_args, *operands)
    if route is None:  # (not for finite codes and scales: the BLAS route's own checks)
        return True

    def tiles():
        exact_tiles_matmul(params, kernel_args, *operands, out)

    def blas():
        blas_matmul(params, kernel_args, *operands, out, None, route[0])

    best = {tiles: np.inf, blas: np.inf}
    with threads_for(0, SERIAL_GEMM_BELOW):
        for run in (tiles, blas):
            run()
        for _ in range(RACE_ROUNDS):
            for run in (tiles, blas):
                start = time.thread_time()
                run()
                best[run] = min(best[run], time.thread_time() - start)
    return best[tiles] < best[blas]


def exact_tiles_matmul(
    params, kernel_args, codes_a, codes_b, scales_a, scales_b, c_values, out, progress=None
):
    """Fill ``out`` (G, M, N) with the outputs of the GEMMs A[g] times B[g] (given as (N,
    K)) by ``_batch_kernels.exact_groups``, each GEMM's output cut into tiles of
    :data:`EXACT_TILE` rows and :data:`EXACT_WIDE_TILE` columns (EXACT_TILE where K is too
    long for a tile's decoded operands to stay within :data:`GROUPS_DECODED`): per panel of
    EXACT_TILE rows and run of up to :data:`EXACT_RUN` columns, one batch whose groups are
    the tiles (A's panel copied to each, B's columns read in place; the last columns in a
    tile of theirs, padded with code 0 to a multiple of EXACT_TILE, whose outputs are
    dropped). Consecutive batches, up to EXACT_RUN / EXACT_TILE tiles in all (no more copies
    of a panel of A than one run's), split their tiles over the threads together
    (:func:`_run_batches`): a GEMM a few hundred columns wide has one or two tiles a panel.
    Operands as :func:`small_groups_matmul` takes them; returns the (group, row, column)
    index arrays of the outputs the generic kernel must compute. ``progress(rows_done,
    rows_total)`` after each panel. Exact as the batches are: every output is its own dot
    product."""
    groups, rows, length = codes_a.shape
    columns = codes_b.shape[1]
    wide = (EXACT_TILE + EXACT_WIDE_TILE) * length <= GROUPS_DECODED
    width = EXACT_WIDE_TILE if wide else EXACT_TILE
    whole = columns // width * width  # columns of whole tiles, read in place
    rest = -(-(columns - whole) // EXACT_TILE) * EXACT_TILE  # the last tile's, padded
    one_c = c_values.shape == (1, 1, 1)
    held = EXACT_RUN // EXACT_TILE  # tiles (copies of a panel of A) at once
    found: list = []
    for g in range(groups):
        runs = [  # (first column, codes and scales of B's tiles of the run)
            (
                c0,
                _tiles(codes_b[g, c0 : min(c0 + EXACT_RUN, whole)], width),
                _tiles(scales_b[g, c0 : min(c0 + EXACT_RUN, whole)], width),
            )
            for c0 in range(0, whole, EXACT_RUN)
        ]
        if rest:
            runs.append((whole, *(_padded_tile(x[g, whole:], rest) for x in (codes_b, scales_b))))
        batches: list = []  # (first row, first column, last of its panel, outputs, arguments, flags)
        for r0 in range(0, rows, EXACT_TILE):
            r1 = min(r0 + EXACT_TILE, rows)
            for c0, tile_codes, tile_scales in runs:
                tiles, tile = tile_codes.shape[:2]
                if batches and sum(batch[3].shape[0] for batch in batches) + tiles > held:
                    found += _finished_batches(g, batches, out, progress)
                    batches = []
                c1 = min(c0 + tiles * tile, columns)
                panel = (tiles, r1 - r0)
                # (copies, writable: a read-only array would be another compilation)
                codes = np.broadcast_to(codes_a[g, r0:r1], (*panel, length)).copy()
                scales = np.broadcast_to(scales_a[g, r0:r1], (*panel, scales_a.shape[2])).copy()
                c_tiles = c_values
                if not one_c:
                    c_panel = c_values[g, r0:r1, c0:c1]
                    if c1 - c0 < tiles * tile:  # (the last tile's columns padded)
                        c_panel = np.zeros((r1 - r0, tiles * tile), dtype=c_values.dtype)
                        c_panel[:, : c1 - c0] = c_values[g, r0:r1, c0:c1]
                    c_tiles = c_panel.reshape(r1 - r0, tiles, tile).transpose(1, 0, 2)
                out_tiles = np.empty((*panel, tile), dtype=out.dtype)
                arguments, flags = _exact_arguments(
                    params,
                    kernel_args,
                    codes,
                    tile_codes,
                    scales,
                    tile_scales,
                    np.ascontiguousarray(c_tiles),
                    out_tiles,
                )
                batches.append((r0, c0, c0 == runs[-1][0], out_tiles, arguments, flags))
        found += _finished_batches(g, batches, out, progress)
    if not found:
        return _NONE_FLAGGED
    return tuple(np.concatenate([part[axis] for part in found]) for axis in range(3))


def _finished_batches(g: int, batches: list, out, progress) -> list:
    """:func:`exact_tiles_matmul`'s ``batches`` of group ``g`` run (:func:`_run_batches`),
    their tiles' outputs written into ``out``; returns the (group, row, column) index arrays
    of the outputs they flagged, one triple a batch that flagged some (rare), and reports
    ``progress`` after each panel whose last batch this is."""
    rows, columns = out.shape[1], out.shape[2]
    found = []
    flagged = _run_batches(B.exact_groups, [batch[4] for batch in batches])
    for (r0, c0, last, out_tiles, _, flags), count in zip(batches, flagged):
        tiles, r1, tile = out_tiles.shape[0], r0 + out_tiles.shape[1], out_tiles.shape[2]
        c1 = min(c0 + tiles * tile, columns)
        by_rows = out_tiles.transpose(1, 0, 2).reshape(r1 - r0, tiles * tile)
        out[g, r0:r1, c0:c1] = by_rows[:, : c1 - c0]
        if count:
            t, m, n = np.nonzero(flags)
            column = c0 + t * tile + n
            kept = column < columns
            found.append((np.full(int(kept.sum()), g), r0 + m[kept], column[kept]))
        if last and progress is not None:
            progress(g * rows + r1, out.shape[0] * rows)
    return found


def _run_batches(kernel, batches: list) -> list[int]:
    """How many outputs ``kernel(*arguments, start, stop)`` flagged in each batch of
    ``batches`` (the arguments of each, its groups the first axis of its first one), every
    batch's groups run at once (``run_in_threads``): the batches' groups together split over
    the threads, where one batch's might be too few; a thread's run of one batch's groups
    one call."""
    starts = np.cumsum([0] + [arguments[0].shape[0] for arguments in batches]).tolist()
    counts: list = []  # (batch, outputs flagged) of every call

    def call(start: int, stop: int) -> None:
        for b, arguments in enumerate(batches):
            low, high = max(start, starts[b]), min(stop, starts[b + 1])
            if low < high:
                counts.append((b, kernel(*arguments, low - starts[b], high - starts[b])))

    run_in_threads(call, starts[-1])
    flagged = [0] * len(batches)
    for b, count in counts:
        flagged[b] += count
    return flagged


def _tiles(rows: np.ndarray, width: int) -> np.ndarray:
    """(tiles, width, ...) view of whole tiles' rows (C-contiguous as ``rows`` is)."""
    return rows.reshape(-1, width, *rows.shape[1:])


def _padded_tile(rows: np.ndarray, width: int) -> np.ndarray:
    """(1, width, ...) copy of fewer rows, padded with zeros."""
    tile = np.zeros((1, width, *rows.shape[1:]), dtype=rows.dtype)
    tile[0, : rows.shape[0]] = rows
    return tile


#: float32 2^x at index x + 127 for the E8M0 exponents x in [-127, 127] (2^-127 subnormal).
_POWERS = np.ldexp(np.float32(1.0), np.arange(-127, 128)).astype(np.float32)
_POWERS.setflags(write=False)


def _float32_plan(params: DatapathParams, tables, c_values) -> tuple | None:
    """(table_a, table_b, powers, per, block, bounds) of
    ``_float32_kernels.scaled_float32_groups`` for this unit, its element tables and c, or
    None where that kernel does not apply: trees of several scale blocks rounded into the
    fp32 accumulator one by one (no grid, no exact accumulator), unfolded tree sums at
    least two bits within float32's 24 (room for the BFP quantizer's sub-blocks, a binade
    apart, in A and in B), finite element tables of float32 values, and a float32 c."""
    if (
        c_values.dtype != np.float32
        or params.accumulator_format == "exact"
        or params.grid_fraction_bits is not None
    ):
        return None
    narrow = [_float32_table(table) for table in tables]
    bounds = _float32_bounds(params)
    if bounds is None or narrow[0] is None or narrow[1] is None:
        return None
    return narrow[0], narrow[1], _POWERS, blocks_per_tree(params), params.block_size, bounds


@functools.lru_cache(maxsize=256)
def _float32_bounds(params: DatapathParams) -> np.ndarray | None:
    """The ``bounds`` of ``_float32_kernels.scaled_float32_groups`` (its module docstring),
    or None where the unit's tree sums leave float32 less than two bits of room: the room
    R = 24 - ``blas.tree_sum_bits``; A's block exponents x with every v 2^x a float32 (v a
    multiple of 2^lsb_a below 2^(e_a + 1): x + lsb_a >= -149, x + e_a + 1 <= 128), within
    [-127, 127]; B's likewise; and the sums X of A's and B's exponents for which every
    partial tree sum (a multiple of 2^(lsb_a + lsb_b + X) below 2^(lsb_a + lsb_b + 24 + X)
    where the trees' spans keep the room) is a float32: X + lsb_a + lsb_b >= -149 and
    X + lsb_a + lsb_b + 24 <= 128."""
    bits = tree_sum_bits(params)
    if bits is None or 24 - bits < 2:
        return None
    (high_a, lsb_a), (high_b, lsb_b) = (
        span_bits(get_format(name)) for name in (params.a_format, params.b_format)
    )
    bounds = np.array(
        [
            24 - bits,
            max(-149 - lsb_a, -127),
            min(127 - high_a, 127),
            max(-149 - lsb_b, -127),
            min(127 - high_b, 127),
            -149 - lsb_a - lsb_b,
            104 - lsb_a - lsb_b,
        ],
        dtype=np.int64,
    )
    bounds.setflags(write=False)
    return bounds


def _float32_groups(params, plan, kernel_args, operands, out, serial: bool):
    """:func:`small_groups_matmul` by ``_float32_kernels.scaled_float32_groups`` (``plan``:
    :func:`_float32_plan`'s), the groups it defers (NaN scales, trees' exponents too far
    apart or out of float32's range) by :func:`_exact_groups`; a batch whose first group
    it would defer, wholly by :func:`_exact_groups` (``first_group_outside``)."""
    codes_a, codes_b, scales_a, scales_b, c_values = operands
    groups = codes_a.shape[0]
    flags = np.zeros(out.shape, dtype=np.uint8)
    deferred = np.empty(groups, dtype=np.uint8)
    exponents = (np.ascontiguousarray(scales_a), np.ascontiguousarray(scales_b))
    if F.first_group_outside(*exponents, plan[3], plan[5]):
        # a batch of sub-blocks far apart (the MX quantizer's): the folded route, without
        # the float32 kernel's checks (nor its compilation, if this is the unit's first)
        return _exact_groups(params, kernel_args, *operands, out, serial)
    arguments = (codes_a, codes_b, *exponents, c_values, *plan, out, flags, deferred)
    flagged = sum(run_groups(F.scaled_float32_groups, arguments, groups, serial))
    if not np.count_nonzero(deferred):  # (most often: no index array to make)
        return np.nonzero(flags) if flagged else _NONE_FLAGGED
    rest = np.flatnonzero(deferred)
    if rest.size == groups:  # (every group: no copies of the operands)
        return _exact_groups(params, kernel_args, *operands, out, serial)
    if rest.size:
        part = np.empty((rest.size,) + out.shape[1:], dtype=out.dtype)
        # (one c group more, never read: a first dimension of 1 marks one c for every output)
        c_part = c_values if c_values.shape == (1, 1, 1) else c_values[np.append(rest, rest[0])]
        g, m, n = _exact_groups(
            params, kernel_args, *(x[rest] for x in operands[:4]), c_part, part, serial
        )
        out[rest] = part
        flags[rest] = 0
        flags[rest[g], m, n] = 1
        flagged += g.size
    return np.nonzero(flags) if flagged else _NONE_FLAGGED


def _folded_groups(params, tables, codes_a, codes_b, scales_a, scales_b, trees: int):
    """A batch of trees of several scale blocks (bfp-exact: 16 products over sub-blocks of 2)
    as :func:`small_groups_matmul`'s kernel takes trees of one scale: (codes_a, codes_b,
    scales_a, scales_b, tables) with each tree's blocks folded onto its least scale
    (``_batch_kernels.fold_group_codes``, or ``fold_block_pairs`` for rows of whole trees of
    8 blocks of 2 over uint16 codes, bfp-exact's MX9) and each code raised to index a table of the
    element values times 2^r, r = 0 to the largest rise kept (exact: powers of two). A
    tree's products then lie on its unscaled grid, and its sums need the unit's
    ``tree_sum_bits`` plus the largest rises of its row and column: within 53 bits, as the
    kernel's sums must be (``datapath.blas``), where A's rows rise at most ``a_limit`` and
    B's at most ``budget - a_limit``. Rows rising more (scales far apart within a tree, a
    NaN scale beside numbers; the BFP quantizer's sub-blocks rise at most 1) take
    ``SCALE_NAN`` as their scales: the kernel flags their outputs, which the generic kernel
    computes. Those rows are first folded again with their blocks of zeros left out
    (:func:`_refold_zero_blocks`: MX INT8's zero sub-blocks take the least scale)."""
    per, block = blocks_per_tree(params), params.block_size
    budget = 53 - tree_sum_bits(params)
    folded = []
    for codes, scales, table in zip((codes_a, codes_b), (scales_a, scales_b), tables):
        groups, rows, length = codes.shape
        least = np.empty((groups, rows, trees), dtype=np.int32)
        tops = np.empty((groups, rows), dtype=np.int64)
        dtype = np.uint16 if table.shape[0] * (budget + 1) <= 1 << 16 else np.uint32
        raised = np.empty(codes.shape, dtype=dtype)
        exponents = np.ascontiguousarray(scales).reshape(groups * rows, -1)
        if (per, block, length, exponents.shape[1]) == (8, 2, 16 * trees, 8 * trees) and (
            codes.dtype == dtype == np.uint16 and codes.flags.c_contiguous
        ):  # bfp-exact's trees of 16 over uint16 codes: each block's two codes as one uint32
            B.fold_block_pairs(
                codes.reshape(-1, length).view(np.uint32),
                exponents,
                table.shape[0],
                budget,
                least.reshape(groups * rows, trees),
                raised.reshape(-1, length).view(np.uint32),
                tops.reshape(-1),
            )
        else:
            B.fold_group_codes(
                codes.reshape(-1, length),
                exponents,
                per,
                block,
                table.shape[0],
                budget,
                least.reshape(groups * rows, trees),
                raised.reshape(-1, length),
                tops.reshape(-1),
            )
        top = int(tops.max(initial=0))
        if top > budget:
            _refold_zero_blocks(codes, scales, table, per, block, budget, least, raised, tops)
            top = int(tops.max(initial=0))
        folded.append((least, raised, tops, top))
    (least_a, raised_a, tops_a, top_a), (least_b, raised_b, tops_b, top_b) = folded
    if top_a + top_b > budget:  # the rows of A rising most flagged first, then B's
        kept_b = int(tops_b[tops_b <= budget].max(initial=0))
        a_limit = max(budget - kept_b, budget // 2)
        least_a[tops_a > a_limit] = SCALE_NAN
        least_b[tops_b > budget - a_limit] = SCALE_NAN
    # every raised code's table, flagged rows' included (their rises stop at ``budget``)
    copies = min(max(top_a, top_b), budget) + 1
    raised_tables = tuple(_raised_table(table, copies) for table in tables)
    return raised_a, raised_b, least_a, least_b, raised_tables


def _refold_zero_blocks(codes, scales, table, per, block, budget, least, raised, tops) -> None:
    """Fold the rows of :func:`_folded_groups`' operand whose rises exceed ``budget`` again,
    in place, with the blocks whose codes all decode to ±0 left out of their trees' least
    (they add nothing whatever their scale: ``blas._fold_code_blocks``' fold) and rising by
    0; rows holding a NaN scale take ``SCALE_NAN`` as their folded scales (flagged)."""
    wide = np.nonzero(tops > budget)
    row_codes = np.ascontiguousarray(codes[wide], dtype=np.uint32)[None]
    row_scales = np.ascontiguousarray(scales[wide])[None]  # (the BLAS route's types)
    row_least = np.empty((1, row_codes.shape[1], least.shape[-1]), dtype=np.int64)
    rises = np.empty(row_scales.shape[:2] + (least.shape[-1] * per,), dtype=np.int64)
    block_of = np.arange(min(codes.shape[-1], scales.shape[-1] * block)) // block
    fold_code_blocks(row_codes, table == 0, row_scales, block_of, per, row_least, rises)
    nan = (row_scales[0] == SCALE_NAN).any(axis=-1)
    least[wide] = np.where(nan[:, None], SCALE_NAN, row_least[0])
    tops[wide] = np.where(nan, budget + 1, rises[0].max(axis=-1, initial=0))
    steps = np.minimum(rises[0][:, block_of], budget) * table.shape[0]
    raised[wide] = row_codes[0] + steps


def _raised_table(table: np.ndarray, copies: int) -> np.ndarray:
    """The element values times 2^r for r = 0 to ``copies`` - 1, one table after another
    (read only). Kept per read-only table owning its memory (the element tables of
    ``datapath.tables``, made once per format; not a view, whose memory may be written
    through another array) and count: a batch of attention heads asks again and again."""
    key = (id(table), copies)
    kept = _RAISED_TABLES.get(key)
    if kept is not None and kept[0] is table:
        return kept[1]
    raised = np.ldexp(table[None, :], np.arange(copies)[:, None]).reshape(-1)
    raised.setflags(write=False)
    _keep(key, table, raised)
    return raised


def _float32_table(table: np.ndarray) -> np.ndarray | None:
    """The element values as float32 (read only), or None where one is not finite or not a
    float32; kept as :func:`_raised_table` keeps its tables."""
    key = (id(table), 0)  # (no raised table has 0 copies)
    kept = _RAISED_TABLES.get(key)
    if kept is not None and kept[0] is table:
        return kept[1]
    narrow: np.ndarray | None = table.astype(np.float32)
    if not (np.isfinite(table).all() and np.array_equal(narrow, table)):
        narrow = None
    else:
        narrow.setflags(write=False)
    _keep(key, table, narrow)
    return narrow


def _keep(key: tuple[int, int], table: np.ndarray, derived) -> None:
    """Keep ``derived`` from ``table`` under ``key`` where the table is read only and owns
    its memory (one that may change is not kept), up to 64 entries."""
    if not table.flags.writeable and table.base is None:
        if len(_RAISED_TABLES) >= 64:
            _RAISED_TABLES.clear()
        _RAISED_TABLES[key] = (table, derived)  # (the table kept alive: its id stays its own)


_RAISED_TABLES: dict[tuple[int, int], tuple[np.ndarray, np.ndarray | None]] = {}


def run_groups(kernel, arguments: tuple, groups: int, serial: bool) -> list:
    """The results of ``kernel(*arguments, start, stop)`` over the ``groups`` groups cut into
    chunks (``run_in_threads``): split over the threads, or where ``serial`` (a small batch)
    on the calling thread alone, with no thread to wake nor Numba's thread count to change."""
    results: list = []
    run_in_threads(
        lambda start, stop: results.append(kernel(*arguments, start, stop)),
        groups,
        1 if serial else None,
    )
    return results


def window_groups_apply(params: DatapathParams, rows: int, columns: int, length: int) -> bool:
    """Whether a batch of groups of ``rows`` x ``columns`` outputs of ``length`` terms through
    this unit takes the window route's small-groups kernel: small groups
    (:data:`WINDOW_GROUP_OUTPUTS` outputs and :data:`WINDOW_GROUP_VALUES` products) or wide
    ones (:data:`WINDOW_WIDE_OUTPUTS`, :data:`WINDOW_WIDE_ROWS`, padded columns from
    ``_batch_kernels.ROW_LANES_FROM``), the kernel's tile of B (its columns padded to whole
    lane blocks) within :data:`WINDOW_GROUP_VALUES`, through a
    unit that takes the window route (``window.window_applies``) whose trees are whole
    passes of the kernel (``_batch_kernels.PASS_TERMS`` terms) and whose int32 groups hold a
    pass's truncated terms (so that their sum stays within int32): every shipped unit's trees
    of 8, 16 or 32 terms; a unit with trees of 4 keeps the per-GEMM window route."""
    padded_columns = -(-columns // B.LANE_BLOCK) * B.LANE_BLOCK  # the tile of B's width
    small = (
        rows * columns <= WINDOW_GROUP_OUTPUTS and rows * columns * length <= WINDOW_GROUP_VALUES
    )
    if _transposed(rows, columns):  # the kernel's tile of B is A's rows
        rows, columns = columns, rows
        padded_columns = -(-columns // B.LANE_BLOCK) * B.LANE_BLOCK
    wide = (
        padded_columns >= B.ROW_LANES_FROM
        and WINDOW_WIDE_ROWS <= rows
        and rows * columns <= WINDOW_WIDE_OUTPUTS
    )
    return (
        (small or wide) and padded_columns * length <= WINDOW_GROUP_VALUES and _window_unit(params)
    )


@functools.lru_cache(maxsize=1024)
def _window_unit(params: DatapathParams) -> bool:
    """The unit checks of :func:`window_groups_apply`, once per unit and formats (the shape
    bounds are read on every call: tests lower them)."""
    if not window_applies(params):
        return False
    cfg = _window_config(params)[0]
    return bool(cfg[W.W_FUSED_TERMS] % B.PASS_TERMS == 0 and cfg[W.W_GROUP] >= B.PASS_TERMS)


@functools.lru_cache(maxsize=None)
def _window_plan(params: DatapathParams):
    """(cfg, (packed_a, zero_a), (packed_b, zero_b)): the window route's config vector
    (``window._window_config``) and each operand's :func:`_packed_tables`, None for a wide
    format's (its tables depend on each call's offset: :func:`_offset_plan`)."""
    cfg, a, b = _window_config(params)
    return cfg, *(None if table.wide else _packed_tables(table) for table in (a, b))


@functools.lru_cache(maxsize=64)
def _offset_plan(fmt_name: str, subnormals: bool, offset: int):
    """:func:`_packed_tables` of a wide format's tables at ``offset``."""
    return _packed_tables(_offset_tables(fmt_name, subnormals, offset))


def _packed_tables(table):
    """(packed, zero): the per-code tables of an element format packed as
    ``_batch_kernels.window_groups`` reads them (int64 entries holding the float32 value's
    bits, the int8 exponent and whether the code is not finite, for a wide format's tables
    not usable; read only), and a code whose entry is a zero element (+0, finite,
    ``ZERO_EXPONENT``: the quantizers' padding), -1 where the format has none."""
    zero_entry = (W.ZERO_EXPONENT & 0xFF) << B.PACKED_EXPONENT_SHIFT
    entries = (
        (table.values.view(np.uint32).astype(np.int64))
        | ((table.exponents.astype(np.int64) & 0xFF) << B.PACKED_EXPONENT_SHIFT)
        | ((~table.finite).astype(np.int64) << B.PACKED_NON_FINITE_SHIFT)
    )
    entries.setflags(write=False)
    zeros = np.flatnonzero(entries == zero_entry)
    return entries, int(zeros[0]) if zeros.size else -1


def _operand_plan(params, fmt_name: str, plan, codes, scales):
    """(packed, zero, scales) of one operand: its format's, or a wide format's at this
    operand's offset (``window.operand_offset``), with scales that carry the offset."""
    if plan is not None:
        return (*plan, scales)
    offset = operand_offset(params, fmt_name, codes)
    return (
        *_offset_plan(fmt_name, params.input_subnormals, offset),
        np.full(scales.shape, offset, dtype=np.int32),
    )


def _live_codes(cfg, codes_a, codes_b, terms, zero_a: int, zero_b: int):
    """(codes_a, codes_b) cut to their first ``terms`` positions rounded up to a whole pass
    of the kernel (``_batch_kernels.PASS_TERMS``; contiguous copies) where every code past
    the cut is the zero code of its format (``zero_a``, ``zero_b``: K padded to whole scale
    blocks by the quantizer; MiniLM's P @ v, K = 14 of 32) and the cut keeps every tree;
    else the codes as they are. The cut changes no output: each term past it is a product
    with a +0 element, a truncated term of 0 whose exponent sum lies below ``threshold`` (a
    zero element's ``ZERO_EXPONENT``), so it neither adds to a tree's sum nor sets its
    reference (``_window_kernels``), and the trees are the same (a tree of padding alone
    would still truncate an accumulator that joins it). Rows of codes are read as uint64
    words: a cut within a word, or rows not whole words, keep the codes."""
    length = codes_a.shape[2]
    if terms is None or min(zero_a, zero_b) < 0:
        return codes_a, codes_b
    cut = -(-terms // B.PASS_TERMS) * B.PASS_TERMS
    fused = int(cfg[W.W_FUSED_TERMS])
    if not 0 < cut < length or -(-cut // fused) != -(-length // fused):
        return codes_a, codes_b
    kept = []
    for codes, zero in ((codes_a, zero_a), (codes_b, zero_b)):
        size = codes.dtype.itemsize
        if (length * size) % 8 or (cut * size) % 8 or not codes.flags.c_contiguous:
            return codes_a, codes_b
        groups, rows, _ = codes.shape
        words = codes.reshape(groups * rows, length).view(np.uint64)
        pattern = _zero_word(zero, codes.dtype)
        out = np.empty((groups * rows, cut * size // 8), dtype=np.uint64)
        if not B.cut_words(words, out.shape[1], pattern, out):
            return codes_a, codes_b
        kept.append(out.view(codes.dtype).reshape(groups, rows, cut))
    return kept[0], kept[1]


@functools.lru_cache(maxsize=64)
def _zero_word(zero: int, dtype: np.dtype) -> np.uint64:
    """A uint64 word of codes ``zero`` of ``dtype`` (:func:`_live_codes`' padding pattern)."""
    return np.full(8 // dtype.itemsize, zero, dtype=dtype).view(np.uint64)[0]


def _transposed(rows: int, columns: int) -> bool:
    """Whether :func:`window_groups_matmul` computes a group of ``rows`` x ``columns``
    outputs as its transpose: wide groups (``_batch_kernels.ROW_LANES_FROM``) with fewer
    padded columns than rows, so that a row's lanes (the kernel's columns) are the longer
    side (longer loops over the lanes for the same work)."""
    padded_rows, padded_columns = (-(-n // B.LANE_BLOCK) * B.LANE_BLOCK for n in (rows, columns))
    return padded_rows >= B.ROW_LANES_FROM and padded_columns < padded_rows


def window_groups_matmul(
    params,
    codes_a,
    codes_b,
    scales_a,
    scales_b,
    c_values,
    out,
    serial: bool = False,
    terms: int | None = None,
):
    """Fill ``out`` (G, M, N, contiguous) with the window route's output codes of the batch
    A[g] (M, K) times B[g] given as (N, K) (codes and scales (G, rows, ...), ``c_values``
    (G, M, N) or (1, 1, 1)), each group's outputs lanes of one kernel call
    (``_batch_kernels.window_groups``); returns the (groups, rows, columns) index arrays of
    the outputs the generic kernel must compute, as ``window.window_matmul`` does;
    ``serial``: on the calling thread alone (:func:`run_groups`); ``terms``: K, where the
    codes' length is K padded to whole scale blocks (the kernel then skips the padding where
    it is zero codes: :func:`_live_codes`), or None."""
    cfg, plan_a, plan_b = _window_plan(params)
    if tree_order(params) is not None:  # the padding then lies inside the reordered runs
        codes_a, codes_b = in_tree_order(params, codes_a), in_tree_order(params, codes_b)
        terms = None
    packed_a, zero_a, scales_a = _operand_plan(params, params.a_format, plan_a, codes_a, scales_a)
    packed_b, zero_b, scales_b = _operand_plan(params, params.b_format, plan_b, codes_b, scales_b)
    overflow = product_overflow_possible(params, *_window_config(params)[1:], scales_a, scales_b)
    codes_a, codes_b = _live_codes(cfg, codes_a, codes_b, terms, zero_a, zero_b)
    groups, rows, _ = codes_a.shape
    columns = codes_b.shape[1]
    flags = np.empty(out.shape, dtype=np.uint8)
    tables = packed_a, packed_b
    transposed = _transposed(rows, columns)
    if transposed:  # C^T = B A^T: the kernel's rows are B's columns (its docstring)
        codes_a, codes_b, scales_a, scales_b = codes_b, codes_a, scales_b, scales_a
        tables = tables[::-1]
        c_values = c_values.transpose(0, 2, 1)
    arguments = (
        codes_a,
        codes_b,
        scales_a,
        scales_b,
        np.ascontiguousarray(c_values).reshape(c_values.shape[0], -1),
        *tables,
        cfg,
        out.reshape(groups, rows * columns),
        flags.reshape(groups, rows * columns),
        # None for narrow groups: the kernel's narrow compilation (its docstring). Its
        # columns are B's, or A's rows where transposed (always wide).
        transposed
        if -(-codes_b.shape[1] // B.LANE_BLOCK) * B.LANE_BLOCK >= B.ROW_LANES_FROM
        else None,
    )
    flagged = run_groups(B.window_groups, arguments, groups, serial)
    if overflow:  # every output the generic kernel's
        return tuple(index.reshape(-1) for index in np.indices(out.shape))
    return np.nonzero(flags) if any(flagged) else _NONE_FLAGGED
