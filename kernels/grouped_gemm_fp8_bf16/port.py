"""The port: CUTLASS example 69's grouped fp8 e5m2 × bf16 GEMM in CuTe DSL for sm_90a.

Algorithm (example 69's, in its swapped coordinates): per group, Dᵀ = alpha · dequant(B) ·
Aᵀ + beta · Cᵀ, so the narrow operand B (N × K, fp8, K-major) is the MMA's A operand and
the activations A (M × K, bf16, K-major) its B operand. The narrow operand is converted
(and, in ScaleOnly mode, multiplied by its chunk's bf16 scale) in registers and fed to
wgmma from registers (the RS form); the activations are read by wgmma from shared memory.

- CTA tile 128 (N) × 16 (M) × 64 (K), as example 69; two consumer warpgroups of 64 rows of
  N each; one producer warp issues TMA loads of the fp8 B tile, its row of bf16 scales
  (ScaleOnly) and the bf16 A tile into a ring of shared-memory buffers (mbarrier
  pipeline) as deep as example 69's, by its builder's rule and carve-outs
  (``stage_count``); 384 threads per CTA.
- Mainloop as the example's (``_mma_k_tile``): per k-block of 16, wait until at most 3
  wgmma are in flight (the one that read the block's registers a K tile earlier has
  retired), convert into them, fence, issue; a stage is released a K tile later, once
  its last wgmma has retired.
- Persistent grouped schedule (``locate_tile``, the rule of ``schedule.locate``): a grid
  of at most one CTA per SM walks the tiles of every group; per-group M comes from two
  small device tensors (row offsets and tile offsets), so one compiled kernel serves any
  set of group sizes.
- Groups are stacked: A, C and D are (sum M, ·) with each group's rows at its row offset
  (TMA loads of a tile that crosses into the next group read rows that the epilogue
  never stores); B is (N, K, groups); scales (N, ceil(K/c), groups), N contiguous.
- Epilogue: fma(beta, C, alpha · acc) in fp32, alpha · acc rounded to fp32 first, in
  the order of CUTLASS's LinearCombination as example 69 builds it (C read from global
  memory, only where beta is not 0; 0 otherwise), rounded to f16, staged in shared memory
  by stmatrix and stored by TMA, as the example; a group's last M tile, when partial, by
  predicated stores from registers (a TMA store of the stacked D would write the next
  group's rows).

Constraints checked by ``schedule.check``: K a multiple of 64, c a multiple of 64 (one scale per
row of a K tile), N a multiple of 16. Known performance gap against the example (untested
on hardware, so not measured): where beta is not 0, C is read from global memory in the
epilogue rather than staged by TMA ahead of it (where beta is 0 neither reads it).
"""

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warp, warpgroup

from kernels.grouped_gemm_fp8_bf16 import schedule

TILE = (schedule.TILE_N, schedule.TILE_M, schedule.TILE_K)
# CUTLASS's sm90 builders align each stage of a swizzled ring to the 128-byte swizzle's
# 1024-byte atom and count a stage's full and empty mbarriers (8 bytes each) beside it.
SMEM_ALIGNMENT, STAGE_BARRIER_BYTES = 1024, 16
TMA_DESCRIPTOR_BYTES = 128  # cute::TmaDescriptor (CUtensorMap)
THREADS = 384  # one producer warpgroup (one warp issues TMA) + two consumer warpgroups
PRODUCER_REGISTERS, CONSUMER_REGISTERS = 40, 232  # setmaxnreg split, as CUTLASS's sm90


def _round_up(n: int, unit: int = SMEM_ALIGNMENT) -> int:
    return -(-n // unit) * unit


def example_kernel_carveout() -> int:
    """What example 69's mainloop builder (CUTLASS's sm90_gmma_builder.inl, the
    mixed-input pointer-array case: ``KernelSmemCarveout``) takes off the shared-memory
    capacity for the kernel: the mainloop's four tensor maps (A, B, scale, zero) and the
    group scheduler's pipeline (``PipelineAsyncSharedStorage<8>``: a full and an empty
    barrier per stage)."""
    return 4 * TMA_DESCRIPTOR_BYTES + 8 * STAGE_BARRIER_BYTES


def example_epilogue_storage() -> int:
    """``sizeof(CollectiveEpilogue::SharedStorage)``, which example 69 carves out of its
    ring's budget (``StageCountAutoCarveout``), by the rules of CUTLASS's sm90_builder.inl
    and sm90_epilogue_array_tma_warpspecialized.hpp for its epilogue (cooperative
    pointer-array TMA, f16 C and D, LinearCombination):

    - epilogue tile min(128, tile N) × gcd(min(32, tile M), tile M); StagesD = min(tiles,
      2); C and D of one width over 8 bits share their buffers (``ReuseSmemC``), so
      StagesC = max(min(tiles, 4), StagesD + 1);
    - tensors: StagesC tiles of C (D reuses them) aligned to the 128-byte swizzle's
      1024 B, then the fusion's empty storage (1 byte in C++), rounded up to 1024 B;
    - tensor maps: one for C and one for D per epilogue warpgroup (2), 128 B each;
    - the C load pipeline: a full and an empty barrier per C stage;

    the struct rounded up to its 1024-byte alignment."""
    tile_n, tile_m, _ = TILE
    epi_n, epi_m = min(128, tile_n), math.gcd(min(32, tile_m), tile_m)
    tiles = (tile_n // epi_n) * (tile_m // epi_m)
    stages_d = min(tiles, 2)
    stages_c = max(min(tiles, 4), stages_d + 1)
    tensors = _round_up(stages_c * epi_n * epi_m * cutlass.Float16.width // 8 + 1)
    tensor_maps = (1 + 2) * TMA_DESCRIPTOR_BYTES
    return _round_up(tensors + tensor_maps + stages_c * STAGE_BARRIER_BYTES)


def stage_count(stage_bytes: int) -> int:
    """The deepest ring that example 69's builder sizes for a stage of ``stage_bytes``
    (CUTLASS's ``compute_stage_count_or_override_single_affine_transformed_input``): the
    capacity less the kernel's carve-out, in whole alignment units, less the epilogue's
    shared storage rounded up to the alignment, over a stage's tiles rounded up to the
    alignment plus its barriers. The port carves out what the example reserves, not what
    it uses (its D tile, 4,096 B), so that its ring is as deep as the example's."""
    capacity = ((schedule.SMEM_LIMIT_BYTES - example_kernel_carveout())
                // SMEM_ALIGNMENT * SMEM_ALIGNMENT)
    return ((capacity - _round_up(example_epilogue_storage()))
            // (_round_up(stage_bytes) + STAGE_BARRIER_BYTES))


@cute.jit
def locate_tile(tile, offsets, groups, n_tiles):
    """``schedule.locate`` in CuTe DSL: (group, n tile, m tile) of linear tile ``tile``."""
    group = tile * 0
    for g in range(groups):
        if offsets[g] <= tile:
            group = g
    local = tile - offsets[group]
    return group, local % n_tiles, local // n_tiles


def swizzle_masks(swizzle) -> tuple[int, int]:
    """The address bits a swizzle ``S<B, M, S>`` writes (M .. M + B - 1) and those it
    reads (S higher): it XORs the second into the first."""
    written = ((1 << swizzle.num_bits) - 1) << swizzle.num_base
    return written, written << swizzle.num_shift


def fp8_pairs(fragment: cute.Tensor, swizzle) -> list[cute.Tensor]:
    """A thread's fp8 B fragment in shared memory (``swizzle`` the ring's, (MMA, MMA_N,
    MMA_K, STAGE)) as 16-bit pairs of K-adjacent values, one ``LDS.U16`` each: per
    k-block, a (pair, MMA_N, STAGE) tensor at the block's first pair, swizzled once.

    The rest of a k-block's pairs (k + 8: 8 bytes, n + 8: 512 bytes) and the stages (8,192
    bytes) lie at offsets that leave the swizzle's bits alone (checked here), and the
    thread's first pair of a block at an address whose bits under them are clear (a pair
    starts at k = 2 · (lane % 4), so no carry reaches them): so each pair's address is the
    block's swizzled address plus a constant, and per K tile the loads cost one add per
    k-block (the stage) where a swizzle applied to each pair's address cost one per pair,
    as example 69's loads do from one base and immediates. ``cute.recast_tensor`` would
    drop the swizzle; the DSL's swizzled pointer applies it to each element's address."""
    pairs = cute.make_tensor(cute.recast_ptr(fragment.iterator, swizzle, dtype=cutlass.Uint16),
                             cute.recast_layout(16, 8, fragment.layout))
    written, read = swizzle_masks(swizzle)
    width = cutlass.Uint16.width // 8
    blocks = []
    for kb in range(cute.size(pairs, mode=[2])):
        block = pairs[(None, None, kb, None)]
        for stride in cute.flatten_to_tuple(block.layout.stride):
            if (stride * width) & (written | read):
                raise ValueError(f"a stride of {stride * width} bytes moves bits of the "
                                 f"swizzle {swizzle}: not a constant offset")
        raw = block.iterator.toint()
        moved = (raw ^ ((raw >> swizzle.num_shift) & written)) - raw  # the swizzle's shift
        plain = cute.recast_ptr(block.iterator, dtype=cutlass.Uint16) + moved // width
        blocks.append(cute.make_tensor(plain, block.layout))
    return blocks


def fp8_halves(blocks: list[cute.Tensor]) -> cute.Tensor:
    """Registers for one stage of ``fp8_pairs``: (pair, MMA_N, MMA_K), fragment order."""
    return cute.make_rmem_tensor((*blocks[0].shape[:2], len(blocks)), cutlass.Uint16)


@cute.jit
def load_fp8_pairs(blocks: list[cute.Tensor], halves: cute.Tensor, stage):
    """Stage ``stage`` of ``fp8_pairs`` into ``halves`` (``fp8_halves``)."""
    for kb in cutlass.range_constexpr(len(blocks)):
        halves[(None, None, kb)].store(blocks[kb][(None, None, stage)].load())


@cute.jit
def fp8_block(halves, words: cute.Tensor, kb, block_shape):
    """k-block ``kb`` of the fp8 fragment, in fragment order, from its loaded pairs
    (``halves``): two pairs per 32-bit word of ``words``, read back as fp8. The DSL's load
    of the fp8 vector itself assembles its bytes one by one (3 ``PRMT`` per pair)."""
    per_block = cute.size(block_shape) // 4
    for j in cutlass.range_constexpr(per_block):
        w = kb * per_block + j
        words[w] = cutlass.Uint32(halves[2 * w]) | (cutlass.Uint32(halves[2 * w + 1]) << 16)
    narrow = cute.recast_tensor(words, cutlass.Float8E5M2)
    return cute.make_tensor(narrow.iterator + kb * per_block * 4,
                            cute.make_layout(block_shape)).load()



class GroupedMixedGemm:
    """Host side (``__call__``, a ``@cute.jit``) and device side (``kernel``)."""

    def __init__(self, scale_only: bool):
        self.scale_only = scale_only
        self.tile = TILE
        tile_n, tile_m, tile_k = TILE
        # A stage: the fp8 B tile, the bf16 A tile and, in ScaleOnly, the B tile's row of
        # bf16 scales.
        self.stages = stage_count(
            tile_n * tile_k * cutlass.Float8E5M2.width // 8
            + tile_m * tile_k * cutlass.BFloat16.width // 8
            + scale_only * tile_n * cutlass.BFloat16.width // 8)

    def make_tiled_mma(self) -> cute.TiledMma:
        """Two warpgroups along N, bf16 × bf16 → fp32, the A operand (converted B) from
        registers: wgmma m64n16k16 in its RS form."""
        k_major = warpgroup.OperandMajorMode.K
        return sm90_utils.make_trivial_tiled_mma(
            cutlass.BFloat16, cutlass.BFloat16, k_major, k_major, cutlass.Float32,
            (2, 1, 1), tiler_mn=(64, self.tile[1]), a_source=warpgroup.OperandSource.RMEM)

    def make_d_store(self, tiled_mma: cute.TiledMma) -> cute.TiledCopy:
        """The epilogue's f16 stores of the accumulators to shared memory: stmatrix x4,
        transposed (the D tile is N contiguous, N the MMA's M), as the example's STSM."""
        return cute.make_tiled_copy_C(
            cute.make_copy_atom(warp.StMatrix8x8x16bOp(True, 4), cutlass.Float16), tiled_mma)

    def _setup(self):
        tile_n, tile_m, tile_k = self.tile
        self.tiled_mma = self.make_tiled_mma()
        self.b_smem_layout = self._staged_layout(cutlass.Float8E5M2, tile_n, tile_k)
        self.a_smem_layout = self._staged_layout(cutlass.BFloat16, tile_m, tile_k)
        # One scale per row of N for the K tile (a K tile lies in one chunk), N contiguous.
        self.scale_smem_layout = cute.make_layout((tile_n, 1, self.stages))
        # The D tile, one (64 of N, 16 of M) half per consumer warpgroup, N contiguous.
        self.d_smem_layout = cute.make_layout((tile_n // 2, tile_m, 2))

    def _staged_layout(self, dtype, rows, tile_k):
        atom = warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(utils.LayoutEnum.ROW_MAJOR, dtype, tile_k), dtype)
        return cute.tile_to_shape(atom, (rows, tile_k, self.stages), order=(0, 1, 2))

    def shared_storage(self):
        """The kernel's shared-memory struct; its size is the dynamic shared memory."""
        stages = self.stages

        @cute.struct
        class SharedStorage:
            barriers: cute.struct.MemRange[cutlass.Int64, stages * 2]
            b_tiles: cute.struct.Align[cute.struct.MemRange[
                cutlass.Float8E5M2, cute.cosize(self.b_smem_layout)], 1024]
            a_tiles: cute.struct.Align[cute.struct.MemRange[
                cutlass.BFloat16, cute.cosize(self.a_smem_layout)], 1024]
            if self.scale_only:
                scales: cute.struct.Align[cute.struct.MemRange[
                    cutlass.BFloat16, cute.cosize(self.scale_smem_layout)], 128]
            d_tile: cute.struct.Align[cute.struct.MemRange[
                cutlass.Float16, cute.cosize(self.d_smem_layout)], 128]

        return SharedStorage

    @cute.jit
    def __call__(self, b: cute.Tensor, a: cute.Tensor, scale: cute.Tensor, c: cute.Tensor,
                 d: cute.Tensor, row_offsets: cute.Tensor, tile_offsets: cute.Tensor,
                 alpha: cutlass.Float32, beta: cutlass.Float32, chunk: cutlass.Int32,
                 grid_ctas: cutlass.Int32, stream: cuda.CUstream):
        """Tensors as problems.make_inputs lays them out: b (G, N, K) fp8; a (sum M, K)
        bf16; scale (G, ceil(K/c), N) bf16; c and d (sum M, N) f16; offsets (G + 1,)
        int32. Viewed here in the kernel's swapped coordinates."""
        b = cute.make_tensor(b.iterator, cute.select(b.layout, mode=[1, 2, 0]))  # (N, K, G)
        scale = cute.make_tensor(scale.iterator, cute.select(scale.layout, mode=[2, 1, 0]))
        c = cute.make_tensor(c.iterator, cute.select(c.layout, mode=[1, 0]))  # (N, sum M)
        d = cute.make_tensor(d.iterator, cute.select(d.layout, mode=[1, 0]))
        self._setup()
        tile_n, tile_m, tile_k = self.tile
        b_one = cute.slice_(self.b_smem_layout, (None, None, 0))
        a_one = cute.slice_(self.a_smem_layout, (None, None, 0))
        tma_b, tma_b_tensor = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), b, b_one, (tile_n, tile_k))
        tma_a, tma_a_tensor = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), a, a_one, (tile_m, tile_k))
        self.tx_bytes = (cute.size_in_bytes(cutlass.Float8E5M2, b_one)
                         + cute.size_in_bytes(cutlass.BFloat16, a_one))
        tma_s, tma_s_tensor = None, None
        if cutlass.const_expr(self.scale_only):
            s_one = cute.slice_(self.scale_smem_layout, (None, None, 0))
            tma_s, tma_s_tensor = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileG2SOp(), scale, s_one, (tile_n, 1))
            self.tx_bytes += cute.size_in_bytes(cutlass.BFloat16, s_one)
        tma_d, tma_d_tensor = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), d,
            cute.slice_(self.d_smem_layout, (None, None, 0)), (tile_n // 2, tile_m))
        self.storage = self.shared_storage()
        self.kernel(tma_b, tma_b_tensor, tma_a, tma_a_tensor, tma_s, tma_s_tensor, c, d,
                    tma_d, tma_d_tensor, row_offsets, tile_offsets, alpha, beta,
                    chunk // tile_k, self.tiled_mma, self.b_smem_layout, self.a_smem_layout,
                    self.scale_smem_layout, self.d_smem_layout).launch(
            grid=[grid_ctas, 1, 1], block=[THREADS, 1, 1], min_blocks_per_mp=1,
            smem=self.storage.size_in_bytes(), stream=stream)

    @cute.kernel
    def kernel(self, tma_b: cute.CopyAtom, m_b: cute.Tensor, tma_a: cute.CopyAtom,
               m_a: cute.Tensor, tma_s: cute.CopyAtom | None, m_s: cute.Tensor | None,
               m_c: cute.Tensor, m_d: cute.Tensor, tma_d: cute.CopyAtom, m_dt: cute.Tensor,
               row_offsets: cute.Tensor, tile_offsets: cute.Tensor, alpha: cutlass.Float32,
               beta: cutlass.Float32, chunk_tiles: cutlass.Int32, tiled_mma: cute.TiledMma,
               b_smem_layout: cute.ComposedLayout, a_smem_layout: cute.ComposedLayout,
               scale_smem_layout: cute.Layout, d_smem_layout: cute.Layout):
        tile_n, tile_m, tile_k = self.tile
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        warpgroup_idx = cute.arch.make_warp_uniform(tidx // 128)
        cta, _, _ = cute.arch.block_idx()
        ctas, _, _ = cute.arch.grid_dim()
        groups = cute.size(m_b, mode=[2])
        n_total = cute.size(m_b, mode=[0])
        n_tiles = (n_total + tile_n - 1) // tile_n
        k_tiles = cute.size(m_b, mode=[1]) // tile_k
        total_tiles = tile_offsets[groups]
        if warp == 0:
            cpasync.prefetch_descriptor(tma_b)
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_d)
            if cutlass.const_expr(self.scale_only):
                cpasync.prefetch_descriptor(tma_s)

        storage = cutlass.utils.SmemAllocator().allocate(self.storage)
        ring = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.barriers.data_ptr(), num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 8),
            tx_count=self.tx_bytes, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)))
        s_b = storage.b_tiles.get_tensor(b_smem_layout.outer, swizzle=b_smem_layout.inner)
        s_a = storage.a_tiles.get_tensor(a_smem_layout.outer, swizzle=a_smem_layout.inner)
        # The D tile as (half n, m, warpgroup) for the TMA stores and as (n, m) for stmatrix.
        s_d = storage.d_tile.get_tensor(d_smem_layout)
        half = tile_n // 2
        s_d_tile = storage.d_tile.get_tensor(cute.make_layout(
            ((half, 2), tile_m), stride=((1, half * tile_m), half)))
        s_s = None
        if cutlass.const_expr(self.scale_only):
            s_s = storage.scales.get_tensor(scale_smem_layout)
        cute.arch.sync_threads()

        if warpgroup_idx == 0:
            cute.arch.setmaxregister_decrease(PRODUCER_REGISTERS)
            if warp == 0:
                state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                     self.stages)
                tile = cta
                while tile < total_tiles:
                    group, n_tile, m_tile = locate_tile(tile, tile_offsets, groups, n_tiles)
                    # This group's B, and A from the group's first row (ragged stacking).
                    g_b = cute.local_tile(m_b[(None, None, group)], (tile_n, tile_k),
                                          (n_tile, None))
                    a_rows = cute.domain_offset((row_offsets[group], 0), m_a)
                    g_a = cute.local_tile(a_rows, (tile_m, tile_k), (m_tile, None))
                    t_sb, t_gb = cpasync.tma_partition(
                        tma_b, 0, cute.make_layout(1), cute.group_modes(s_b, 0, 2),
                        cute.group_modes(g_b, 0, 2))
                    t_sa, t_ga = cpasync.tma_partition(
                        tma_a, 0, cute.make_layout(1), cute.group_modes(s_a, 0, 2),
                        cute.group_modes(g_a, 0, 2))
                    for k_tile in cutlass.range(k_tiles):
                        ring.producer_acquire(state)
                        barrier = ring.producer_get_barrier(state)
                        cute.copy(tma_b, t_gb[(None, k_tile)], t_sb[(None, state.index)],
                                  tma_bar_ptr=barrier)
                        cute.copy(tma_a, t_ga[(None, k_tile)], t_sa[(None, state.index)],
                                  tma_bar_ptr=barrier)
                        if cutlass.const_expr(self.scale_only):
                            # The K tile's scale chunk, divided here as the example's
                            # producer does (reload_factor), not in the consumers' loop.
                            g_s = cute.local_tile(m_s[(None, None, group)], (tile_n, 1),
                                                  (n_tile, k_tile // chunk_tiles))
                            t_ss, t_gs = cpasync.tma_partition(
                                tma_s, 0, cute.make_layout(1), cute.group_modes(s_s, 0, 2),
                                cute.group_modes(g_s, 0, 2))
                            cute.copy(tma_s, t_gs, t_ss[(None, state.index)],
                                      tma_bar_ptr=barrier)
                        ring.producer_commit(state)
                        state.advance()
                    tile += ctas
                ring.producer_tail(state)
        else:
            cute.arch.setmaxregister_increase(CONSUMER_REGISTERS)
            self._consume(ring, s_b, b_smem_layout.inner, s_a, s_s, s_d, s_d_tile, m_c, m_d,
                          tma_d, m_dt, row_offsets, tile_offsets, alpha, beta, tiled_mma, cta,
                          ctas, groups, n_tiles, k_tiles, total_tiles, tidx - 128,
                          warpgroup_idx - 1)

    @cute.jit
    def _consume(self, ring, s_b, b_swizzle, s_a, s_s, s_d, s_d_tile, m_c, m_d, tma_d, m_dt,
                 row_offsets, tile_offsets, alpha, beta, tiled_mma, cta, ctas, groups, n_tiles,
                 k_tiles, total_tiles, thread, warpgroup_idx):
        """The two consumer warpgroups: convert and scale B in registers, wgmma, epilogue."""
        tile_n, tile_m, tile_k = self.tile
        thr_mma = tiled_mma.get_slice(thread)
        t_sb = thr_mma.partition_A(s_b)  # (MMA, MMA_N, MMA_K, STAGE) fp8, this thread's
        t_sb_pairs = fp8_pairs(t_sb, b_swizzle)
        halves = fp8_halves(t_sb_pairs)
        words = cute.make_rmem_tensor((cute.size(halves) // 2,), cutlass.Uint32)
        t_sa = thr_mma.partition_B(s_a)
        t_ra = tiled_mma.make_fragment_A(thr_mma.partition_A(s_b)[(None, None, None, 0)])
        t_rb = tiled_mma.make_fragment_B(t_sa)
        # Coordinates (n, k) inside the tile of each element of this thread's B fragment,
        # and (n, m) of each accumulator element.
        b_coords = thr_mma.partition_A(cute.make_identity_tensor((tile_n, tile_k)))
        acc_coords = thr_mma.partition_C(cute.make_identity_tensor((tile_n, tile_m)))
        acc = cute.make_rmem_tensor(acc_coords.shape, cutlass.Float32)
        d_frag = cute.make_rmem_tensor(acc_coords.shape, cutlass.Float16)  # D, in f16
        d_store = self.make_d_store(tiled_mma)
        t_sd = d_store.get_slice(thread).partition_D(s_d_tile)
        t_rd = d_store.get_slice(thread).retile(d_frag)
        scales = cute.make_rmem_tensor(t_ra.shape, cutlass.BFloat16)
        # The stage read next, and the stage released next: one K tile behind, since a
        # stage is free only once the last wgmma reading it has retired.
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                               self.stages)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        # Whether the stage read next was seen full when tested, after the previous K
        # tile's last wgmma was issued (the example's try-wait): then no wait is needed.
        ready = cutlass.Boolean(False)
        tile = cta
        while tile < total_tiles:
            group, n_tile, m_tile = locate_tile(tile, tile_offsets, groups, n_tiles)
            acc.fill(0.0)
            self._mma_k_tile(ring, state, ready, t_sb_pairs, halves, words, t_ra, t_rb, s_s,
                             b_coords, scales, acc, tiled_mma)
            state.advance()
            ready = ring.consumer_try_wait(state)
            for _ in cutlass.range(k_tiles - 1):
                self._mma_k_tile(ring, state, ready, t_sb_pairs, halves, words, t_ra, t_rb, s_s,
                                 b_coords, scales, acc, tiled_mma)
                state.advance()
                ready = ring.consumer_try_wait(state)
                # The previous K tile's wgmma retired at this one's last wait_group.
                ring.consumer_release(release)
                release.advance()
            warpgroup.wait_group(0)
            ring.consumer_release(release)
            release.advance()
            self._epilogue(acc, acc_coords, d_frag, d_store, t_rd, t_sd, m_c, m_d, tma_d,
                           m_dt, s_d, row_offsets, group, n_tile, m_tile, alpha, beta,
                           warpgroup_idx, thread % 128 == 0)
            tile += ctas
        if thread % 128 == 0:
            cute.arch.cp_async_bulk_wait_group(0)  # this warpgroup's last D tile written

    @cute.jit
    def _mma_k_tile(self, ring, state, ready, t_sb_pairs, halves, words, t_ra, t_rb, s_s,
                    b_coords, scales, acc, tiled_mma):
        """One K tile as example 69's mainloop issues it: per k-block of 16, wait until
        the wgmma that last read that block's registers (the previous K tile's) has
        retired, convert (and scale) the block into them, fence, issue its wgmma and
        commit it, leaving up to k_blocks - 1 wgmma in flight."""
        k_blocks = cute.size(t_ra, mode=[2])
        ring.consumer_wait(state, ready)
        load_fp8_pairs(t_sb_pairs, halves, state.index)
        if cutlass.const_expr(self.scale_only):
            for i in cutlass.range_constexpr(cute.size(scales)):
                scales[i] = s_s[(b_coords[i][0], 0, state.index)]
        for kb in cutlass.range_constexpr(k_blocks):
            warpgroup.wait_group(k_blocks - 1)
            block = fp8_block(halves, words, kb, t_ra[(None, None, kb)].shape).to(
                cutlass.BFloat16)
            if cutlass.const_expr(self.scale_only):
                block = block * scales[(None, None, kb)].load()
            t_ra[(None, None, kb)].store(block)
            warpgroup.fence()
            cute.gemm(tiled_mma, acc, t_ra[(None, None, kb)],
                      t_rb[(None, None, kb, state.index)], acc)
            warpgroup.commit_group()

    @cute.jit
    def _epilogue(self, acc, acc_coords, d_frag, d_store, t_rd, t_sd, m_c, m_d, tma_d, m_dt,
                  s_d, row_offsets, group, n_tile, m_tile, alpha, beta, warpgroup_idx,
                  issuer):
        """D = fma(beta, C, alpha · acc) in fp32, alpha · acc rounded to fp32 first, then
        rounded to f16: the order of example 69's epilogue (Sm90LinearCombinationPtrArray:
        multiplies then homogeneous_multiply_add, one FMUL and one FFMA in its SASS). Where
        C is not read (beta 0) it is 0 in the fma, as the example clears its C fragment
        then. A tile whose 16 rows all lie in the group goes through shared memory and a TMA
        store, each warpgroup its 64 rows of N (the store clips N); the group's last tile,
        when partial, is stored from registers, predicated, since a TMA store of the
        stacked D would write the next group's rows."""
        tile_n, tile_m, _ = self.tile
        half = tile_n // 2
        row_start, row_end = row_offsets[group], row_offsets[group + 1]
        n_total = cute.size(m_d, mode=[0])
        # C is read only where beta is not 0, as the example's epilogue loads it only then
        # (is_C_load_needed: its LinearCombination's beta is_zero) and otherwise clears
        # its C fragment, so fma(0, 0, alpha · acc): alpha · acc, a -0 made +0.
        read_c = beta != cutlass.Float32(0.0)
        if row_start + (m_tile + 1) * tile_m <= row_end:
            # Named barrier 1 + warpgroup: this warpgroup's 128 threads only (0 is the CTA's).
            barrier_id, threads = 1 + warpgroup_idx, 128
            if issuer:  # the half is free once its previous TMA store has read it
                cute.arch.cp_async_bulk_wait_group(0, read=True)
            cute.arch.barrier(barrier_id=barrier_id, number_of_threads=threads)
            for i in cutlass.range_constexpr(cute.size(acc)):
                n = n_tile * tile_n + acc_coords[i][0]
                row = row_start + m_tile * tile_m + acc_coords[i][1]
                scaled = alpha * acc[i]  # rounded to fp32: CUTLASS's alpha · acc node
                c = cutlass.Float32(0.0)  # beyond N: staged, then clipped by the store
                if n < n_total and read_c:
                    c = m_c[(n, row)].to(cutlass.Float32)
                d_frag[i] = cute.math.fma(beta, c, scaled).to(cutlass.Float16)
            cute.copy(d_store, t_rd, t_sd)
            cute.arch.fence_proxy("async.shared", space="cta")  # visible to the TMA store
            cute.arch.barrier(barrier_id=barrier_id, number_of_threads=threads)
            if issuer:
                g_d = cute.local_tile(cute.domain_offset((0, row_start), m_dt),
                                      (half, tile_m), (n_tile * 2 + warpgroup_idx, m_tile))
                s_half, g_half = cpasync.tma_partition(
                    tma_d, 0, cute.make_layout(1),
                    cute.group_modes(s_d[(None, None, warpgroup_idx)], 0, 2),
                    cute.group_modes(g_d, 0, 2))
                cute.copy(tma_d, s_half, g_half)
                cute.arch.cp_async_bulk_commit_group()
        else:
            for i in cutlass.range_constexpr(cute.size(acc)):
                n = n_tile * tile_n + acc_coords[i][0]
                row = row_start + m_tile * tile_m + acc_coords[i][1]
                if n < n_total and row < row_end:
                    scaled = alpha * acc[i]
                    c = cutlass.Float32(0.0)
                    if read_c:
                        c = m_c[(n, row)].to(cutlass.Float32)
                    m_d[(n, row)] = cute.math.fma(beta, c, scaled).to(cutlass.Float16)
