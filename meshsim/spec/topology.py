"""A simulated cluster: H hosts x D devices, and the environment torchrun gives each rank."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import InputError

MAX_WORLD = 1 << 20  # the model tier's reach; each executor has its own, smaller limit


class TopologyError(InputError):
    """A topology that cannot exist (zero hosts, a world too large to simulate)."""


@dataclass(frozen=True)
class Topology:
    hosts: int
    devices_per_host: int

    def __post_init__(self) -> None:
        for name in ("hosts", "devices_per_host"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise TopologyError(f"{name} must be a positive integer, got {value!r}")
        if self.world > MAX_WORLD:
            raise TopologyError(f"world of {self.world} ranks is larger than meshsim simulates ({MAX_WORLD})")

    @property
    def world(self) -> int:
        return self.hosts * self.devices_per_host

    def host_of(self, rank: int) -> int:
        return rank // self.devices_per_host

    def local_rank(self, rank: int) -> int:
        return rank % self.devices_per_host

    def env(self, rank: int, master_port: int, master_addr: str = "127.0.0.1") -> dict[str, str]:
        """What torchrun's local agent exports to `rank` on its host (see LocalElasticAgent)."""
        return {
            "RANK": str(rank),
            "LOCAL_RANK": str(self.local_rank(rank)),
            "WORLD_SIZE": str(self.world),
            "LOCAL_WORLD_SIZE": str(self.devices_per_host),
            "GROUP_RANK": str(self.host_of(rank)),
            "GROUP_WORLD_SIZE": str(self.hosts),
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(self.world),
            "ROLE_NAME": "default",
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_RUN_ID": "meshsim",
            "OMP_NUM_THREADS": "1",
        }

    def gpu_slice(self, rank: int) -> str:
        """CUDA_VISIBLE_DEVICES for the host of `rank`: each simulated host sees its own D GPUs."""
        first = self.host_of(rank) * self.devices_per_host
        return ",".join(str(first + i) for i in range(self.devices_per_host))

    def __str__(self) -> str:
        return f"{self.hosts}x{self.devices_per_host}"

    @classmethod
    def parse(cls, text: str) -> Topology:
        """'2x4' -> Topology(2, 4)."""
        try:
            hosts, devices = (int(part) for part in text.lower().split("x"))
        except ValueError:
            raise TopologyError(f"topology must look like HxD (e.g. 2x4), got {text!r}") from None
        return cls(hosts, devices)
