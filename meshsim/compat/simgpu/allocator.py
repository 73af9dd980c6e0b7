"""The CUDA caching allocator's books for one simulated GPU: what `torch.cuda.memory_stats()` reads.

The model (pure arithmetic, no torch), and where it is simpler than CUDA's:
- a block is its request rounded up to 512 bytes (kMinBlockSize); a request of 1 MiB or less is served from the
  small pool, whose segments are 2 MiB (kSmallBuffer), a larger one from the large pool, whose segments are 20 MiB
  for requests under 10 MiB (kLargeBuffer) and the request rounded up to 2 MiB above (kRoundLarge);
- a freed block stays reserved (cached) for later requests of its pool; a request is served from its pool's
  cached bytes whenever they add up to enough: **a pool never fragments**, so reserved memory is what CUDA
  reserves at best (CUDA also splits and cannot always reuse a freed block; its reserved figure is then higher);
- a request the cache cannot serve reserves a new segment; if that passes the capacity (or the fraction set by
  set_per_process_memory_fraction), the cache is released and the request retried (num_alloc_retries), then it
  fails with CUDA's out-of-memory message (num_ooms);
- empty_cache releases every whole segment's worth of cached bytes of each pool.
Active bytes are allocated bytes (no block waits on another stream here); there are no inactive split blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
MIN_BLOCK = 512
SMALL_SIZE = 1 * MiB
SMALL_SEGMENT = 2 * MiB
LARGE_SEGMENT = 20 * MiB
MIN_LARGE_ALLOC = 10 * MiB
ROUND_LARGE = 2 * MiB

POOLS = ("small_pool", "large_pool")
COUNTED = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
           "active_bytes", "inactive_split_bytes", "requested_bytes")


def round_size(size: int) -> int:
    """A request's block size (CUDACachingAllocator's round_size without roundup_power2_divisions)."""
    return MIN_BLOCK if size < MIN_BLOCK else MIN_BLOCK * ((size + MIN_BLOCK - 1) // MIN_BLOCK)


def pool_of(block: int) -> str:
    return "small_pool" if block <= SMALL_SIZE else "large_pool"


def segment_for(block: int) -> int:
    if block <= SMALL_SIZE:
        return SMALL_SEGMENT
    if block < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return ROUND_LARGE * ((block + ROUND_LARGE - 1) // ROUND_LARGE)


def format_size(size: int) -> str:
    """CUDA's format_size, as its out-of-memory message prints sizes."""
    if size <= 1024:
        return f"{size} bytes"
    if size <= 1048576:
        return f"{size / KiB:.2f} KiB"
    if size <= 1073741824:
        return f"{size / MiB:.2f} MiB"
    return f"{size / GiB:.2f} GiB"


@dataclass
class Stat:
    current: int = 0
    peak: int = 0
    allocated: int = 0
    freed: int = 0

    def add(self, amount: int) -> None:
        self.current += amount
        self.allocated += amount
        if self.current > self.peak:
            self.peak = self.current

    def remove(self, amount: int) -> None:
        self.current -= amount
        self.freed += amount


@dataclass
class Pool:
    segments: list[int] = field(default_factory=list)  # the sizes of its reserved segments
    allocated: int = 0
    reserved: int = 0  # sum(segments), kept as they change: every allocation asks what is cached

    def add_segment(self, size: int) -> None:
        self.segments.append(size)
        self.reserved += size

    def release_segment(self, size: int) -> None:
        self.segments.remove(size)
        self.reserved -= size

    @property
    def cached(self) -> int:
        return self.reserved - self.allocated


class OutOfMemory(Exception):
    """A request the device cannot hold; `message` is CUDA's."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class Allocator:
    """One simulated GPU's caching allocator (see the module's docstring for the model)."""

    def __init__(self, device: int, capacity: int):
        self.device = device
        self.capacity = capacity
        self.fraction = 1.0
        self.pools = {name: Pool() for name in POOLS}
        self.stats = {(kind, pool): Stat() for kind in COUNTED for pool in ("all",) + POOLS}
        # each pool's Stats that one allocation moves, by what they count (blocks, block bytes, requested bytes):
        # an allocation and a free walk these lists alone (they are most of a training step's accounting)
        self._moved = {pool: tuple(tuple(self.stats[(kind, where)] for kind in kinds for where in ("all", pool))
                                   for kinds in (("allocation", "active"), ("allocated_bytes", "active_bytes"),
                                                 ("requested_bytes",)))
                       for pool in POOLS}
        self.retries = 0
        self.ooms = 0
        self.device_allocs = 0
        self.device_frees = 0

    @property
    def limit(self) -> int:
        return int(self.capacity * self.fraction)

    @property
    def allocated(self) -> int:
        return sum(p.allocated for p in self.pools.values())

    @property
    def reserved(self) -> int:
        return sum(p.reserved for p in self.pools.values())

    def _count(self, kinds: tuple[str, ...], pool: str, amount: int) -> None:
        stats = self.stats
        for kind in kinds:
            for stat in (stats[(kind, "all")], stats[(kind, pool)]):
                if amount >= 0:
                    stat.add(amount)
                else:
                    stat.remove(-amount)

    def allocate(self, size: int) -> int:
        """Account a request of `size` bytes; returns its block size. OutOfMemory where CUDA would fail."""
        if size <= 0:
            return 0  # CUDA hands out no memory for an empty tensor
        block = round_size(size)
        name = pool_of(block)
        pool = self.pools[name]
        if pool.cached < block:
            self._reserve(name, segment_for(block), block, size)
        pool.allocated += block
        for stats, amount in zip(self._moved[name], (1, block, size)):
            for stat in stats:  # (Stat.add, inlined)
                stat.current += amount
                stat.allocated += amount
                if stat.current > stat.peak:
                    stat.peak = stat.current
        return block

    def check(self, size: int) -> None:
        """Raise OutOfMemory, as allocate(size) would, without allocating (a request refused before the host
        allocates it); after it passes, allocate(size) does."""
        if size > 0:
            block = round_size(size)
            if self.pools[pool_of(block)].cached < block:
                self._make_room(segment_for(block), size)

    def _make_room(self, segment: int, size: int) -> None:
        if self.reserved + segment > self.limit:
            self.retries += 1  # CUDA frees its cached blocks and tries once more
            self.empty_cache()
            if self.reserved + segment > self.limit:
                self.ooms += 1
                raise OutOfMemory(self.oom_message(size))

    def _reserve(self, name: str, segment: int, block: int, size: int) -> None:
        self._make_room(segment, size)
        self.pools[name].add_segment(segment)
        self.device_allocs += 1
        self._count(("segment",), name, 1)
        self._count(("reserved_bytes",), name, segment)

    def free(self, size: int) -> None:
        """Return a request of `size` bytes (as given to allocate) to its pool's cache."""
        if size <= 0:
            return
        block = round_size(size)
        name = pool_of(block)
        self.pools[name].allocated -= block
        for stats, amount in zip(self._moved[name], (1, block, size)):
            for stat in stats:  # (Stat.remove, inlined)
                stat.current -= amount
                stat.freed += amount

    def empty_cache(self) -> None:
        """Release the cached segments each pool can give back whole (largest first)."""
        for name, pool in self.pools.items():
            for segment in sorted(pool.segments, reverse=True):
                if pool.cached >= segment:
                    pool.release_segment(segment)
                    self.device_frees += 1
                    self._count(("segment",), name, -1)
                    self._count(("reserved_bytes",), name, -segment)

    def reset_peaks(self) -> None:
        for stat in self.stats.values():
            stat.peak = stat.current

    def reset_accumulated(self) -> None:
        for stat in self.stats.values():
            stat.allocated = stat.freed = 0
        self.retries = self.ooms = 0

    def memory_stats(self) -> OrderedDict[str, int]:
        """torch.cuda.memory_stats()'s flat dictionary, every key CUDA's allocator reports, sorted as torch does."""
        flat: dict[str, int] = {}
        for (kind, pool), stat in self.stats.items():
            for metric in ("current", "peak", "allocated", "freed"):
                flat[f"{kind}.{pool}.{metric}"] = getattr(stat, metric)
        for kind in ("oversize_allocations", "oversize_segments"):
            for metric in ("current", "peak", "allocated", "freed"):
                flat[f"{kind}.{metric}"] = 0
        flat.update({"num_alloc_retries": self.retries, "num_ooms": self.ooms, "num_sync_all_streams": 0,
                     "num_device_alloc": self.device_allocs, "num_device_free": self.device_frees,
                     "max_split_size": -1})
        return OrderedDict(sorted(flat.items()))

    def oom_message(self, size: int) -> str:
        reserved, allocated = self.reserved, self.allocated
        free = max(self.capacity - reserved, 0)
        limit = "" if self.fraction >= 1 else (f" Process has {format_size(self.limit)} memory limit (set by "
                                                "set_per_process_memory_fraction).")
        return (f"CUDA out of memory. Tried to allocate {format_size(round_size(size))}. GPU {self.device} has a "
                f"total capacity of {format_size(self.capacity)} of which {format_size(free)} is free.{limit} "
                f"Of the allocated memory {format_size(allocated)} is allocated by PyTorch, and "
                f"{format_size(reserved - allocated)} is reserved by PyTorch but unallocated. If reserved but "
                "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
                "fragmentation.  See documentation for Memory Management  "
                "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
