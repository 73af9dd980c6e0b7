"""Named layouts from public training reports, as topologies and plans for every tier.

Each layout is the mesh a real run used, with its source; `plan()` builds the mesh, slices the dims training
code slices, flattens the data-parallel dims as FSDP/HSDP code does, and checks every group of the result.
The plans take any tier; at these sizes the fake tier (`meshsim run --tier fake`) and the model tier are the
ones that fit on a laptop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..spec.plan import Plan, step
from ..spec.topology import Topology


@dataclass(frozen=True)
class NamedLayout:
    name: str
    dims: tuple[tuple[str, int], ...]  # outermost first, as init_device_mesh takes them
    devices_per_host: int
    source: str

    @property
    def world(self) -> int:
        return math.prod(size for _, size in self.dims)

    @property
    def topology(self) -> Topology:
        return Topology(self.world // self.devices_per_host, self.devices_per_host)

    def plan(self, collectives: bool = False) -> Plan:
        names = [n for n, _ in self.dims]
        steps = [step("init_device_mesh", out="mesh", shape=[s for _, s in self.dims], names=names),
                 step("check", mesh="mesh", collectives=collectives)]
        data = [n for n in names if n.startswith(("dp", "ep"))]
        if len(data) > 1:
            steps += [step("slice", src="mesh", names=data, out="data"),
                      step("flatten", src="data", name="_".join(data), out="data_flat"),
                      step("check", mesh="data_flat", collectives=collectives)]
        inner = [n for n in names if n in ("cp", "tp")]
        if inner:
            steps += [step("slice", src="mesh", names=inner, out="inner"),
                      step("check", mesh="inner", collectives=collectives)]
        return Plan(tuple(steps))


LAYOUTS = {
    layout.name: layout for layout in (
        NamedLayout("llama3-405b", (("pp", 16), ("dp", 128), ("cp", 1), ("tp", 8)), 8,
                    "The Llama 3 Herd of Models (Meta, 2024), Table 4: 16,384 H100 GPUs as TP 8, CP 1, PP 16, "
                    "DP 128 for 405B pre-training at 8K sequence length"),
        NamedLayout("llama3-405b-long-context", (("pp", 16), ("dp", 8), ("cp", 16), ("tp", 8)), 8,
                    "The Llama 3 Herd of Models (Meta, 2024), Table 4: 16,384 GPUs as TP 8, CP 16, PP 16, DP 8 "
                    "for the 128K-context stage"),
        NamedLayout("deepseek-v3", (("pp", 16), ("dp", 2), ("ep", 64)), 8,
                    "DeepSeek-V3 Technical Report (2024), section 3.2: 2,048 H800 GPUs, 16-way pipeline, "
                    "64-way expert parallelism across 8 nodes, ZeRO-1 data parallelism over the rest"),
    )
}
