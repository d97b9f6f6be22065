"""Placing a model that does not fit one GPU: its layers split in order over the fewest GPUs of
one node that hold them, the head's GPU carrying the working memory."""

from __future__ import annotations

from dataclasses import dataclass

from resdyn.cluster.cost import Cost, Shape
from resdyn.cluster.gpu_kinds import GB


class FitError(ValueError):
    """A job that fits no GPU of a kind even on all the GPUs of one node."""


def working_bytes(cost: Cost, s: Shape) -> float:
    """Device bytes of a GPU job besides the weights (gathered states, logit chunks, translators and
    their optimiser state, Jacobian work). On several GPUs they sit on the head's device: resdyn
    gathers the states there and runs the readout there (:func:`resdyn.lm.sublayers.gather_device`);
    the activations passing through the other devices fit their 1 − :data:`GPU_USABLE_FRACTION`."""
    return max(0.0, cost.device_bytes - s.weight_bytes)


def block_bytes(s: Shape) -> list[float]:
    """Weight bytes of the blocks a model is placed by, in forward order: the embedding, each
    decoder layer, the final norm and unembedding (the head)."""
    embed = float(s.vocab * s.d * s.dtype_bytes)
    return [embed, *([float(s.layer_params * s.dtype_bytes)] * s.n_layers), embed]


def split_blocks(sizes: list[float], capacities: list[float]) -> list[int] | None:
    """Device of each block: contiguous runs over the devices (in order, device i holding at most
    ``capacities[i]`` bytes) that minimise the largest device's load — a balanced pipeline split
    that leaves each device as much headroom as it can; None when no split fits. Bisection on the
    largest load with the greedy check (a run is closed when the next block would exceed it)."""

    def greedy(bound: float) -> list[int] | None:
        out, dev, load = [], 0, 0.0
        for size in sizes:
            while load + size > min(bound, capacities[dev]):
                dev, load = dev + 1, 0.0
                if dev >= len(capacities):
                    return None
            out.append(dev)
            load += size
        return out

    if greedy(max(capacities)) is None:
        return None
    lo, hi = sum(sizes) / len(capacities), max(capacities)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if greedy(mid) is None:
            lo = mid
        else:
            hi = mid
    return greedy(hi)


@dataclass(frozen=True)
class Placement:
    """Where a model's blocks go on ``devices`` GPUs: ``embed``, ``layers`` (one device index per
    decoder layer), ``head``; ``loads``: weight + working bytes per device."""

    devices: int
    embed: int
    layers: tuple[int, ...]
    head: int
    loads: tuple[float, ...]

    def device_map(self) -> dict[str, int]:
        """The blocks' devices, accelerate style: ``embed``, ``layers.{i}``, ``head`` -> device index
        (:func:`resdyn.lm.models.device_map` turns it into the model's module names)."""
        return {"embed": self.embed, **{f"layers.{i}": d for i, d in enumerate(self.layers)}, "head": self.head}

    def describe(self) -> str:
        """``cuda:0 embed + layers 0-31 (60.1 GB), cuda:1 layers 32-63 + head (58.3 GB)``."""
        parts = []
        for dev in range(self.devices):
            idx = [i for i, d in enumerate(self.layers) if d == dev]
            what = (
                (["embed"] if self.embed == dev else [])
                + ([f"layers {idx[0]}-{idx[-1]}"] if idx else [])
                + (["head"] if self.head == dev else [])
            )
            parts.append(f"cuda:{dev} {' + '.join(what)} ({self.loads[dev] / GB:.1f} GB)")
        return ", ".join(parts)


def placement(s: Shape, devices: int, capacity: float, working: float = 0.0) -> Placement | None:
    """The layer placement of a model on ``devices`` GPUs of ``capacity`` usable bytes each, with
    ``working`` bytes (:func:`working_bytes`) on the last one, which holds the head; None when it
    does not fit."""
    sizes = block_bytes(s)
    capacities = [capacity] * (devices - 1) + [capacity - working - sizes[-1]]
    where = split_blocks(sizes[:-1], capacities) if capacities[-1] >= 0 else None
    if where is None:
        return None
    where.append(devices - 1)
    loads = [0.0] * (devices - 1) + [working]
    for size, dev in zip(sizes, where):
        loads[dev] += size
    return Placement(devices, where[0], tuple(where[1:-1]), where[-1], tuple(loads))


#: GPU rules whose model may be placed by layer across the GPUs of one node (their forward passes
#: move the activations along: resdyn.lm.sublayers); the Jacobians run on one GPU (a block of layers
#: per job, jacobian.layers_per_job), spectra and bootstrap hold no model.
SPANNING_RULES = ("activations", "lens", "lens_metrics", "causal")
