"""Which host CPU devices form which simulated slice, and the one pathwaysutils seam that asks.

Slice ``k`` of a :class:`Topology` is devices ``k*D .. k*D+D-1`` of ``jax.devices()``
ordered by id. :meth:`Topology.slice_of` is each device's ``slice_index`` while a simulator
is active, and :meth:`Topology.group` is what the simulator answers at
``pathwaysutils.elastic.elastic.get_slice_to_devices`` (:mod:`elastic_dew.simulate.patches`
installs both), so ``Manager()`` with no arguments sees the devices grouped into slices and
leaves out host devices outside every slice.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import jax

__all__ = ["Topology", "check_slice_index"]

logger = logging.getLogger(__name__)


def _whole(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r} must be a whole number >= 1")


@dataclasses.dataclass(frozen=True)
class Topology:
    """``slices`` slices of ``devices_per_slice`` devices, built from the host's CPU devices.

    Args:
        slices: how many slices.
        devices_per_slice: devices in each.
        slice_to_devices: each slice's devices.
        device_slice: each device id's slice.
    """

    slices: int
    devices_per_slice: int
    slice_to_devices: dict[int, list[jax.Device]] = dataclasses.field(repr=False)
    device_slice: dict[int, int] = dataclasses.field(repr=False)

    @staticmethod
    def check_shape(slices: int, devices_per_slice: int) -> None:
        """Refuse a shape that is not whole numbers >= 1, before anything else is touched.

        Args:
            slices: how many slices.
            devices_per_slice: devices in each.

        Raises:
            ValueError: either is not a whole number >= 1.
        """
        _whole("slices", slices)
        _whole("devices_per_slice", devices_per_slice)

    @classmethod
    def from_host(cls, slices: int, devices_per_slice: int) -> Topology:
        """Group the first ``slices * devices_per_slice`` CPU devices into slices.

        Args:
            slices: how many slices.
            devices_per_slice: devices in each.

        Returns:
            The topology.

        Raises:
            RuntimeError: JAX's backend is not the CPU, or the host has too few devices
                (saying what to set before JAX starts).
        """
        cls.check_shape(slices, devices_per_slice)
        needed = slices * devices_per_slice
        devices = sorted(jax.devices(), key=lambda device: device.id)
        if devices[0].platform != "cpu":
            raise RuntimeError(
                f"SimulatedSlices runs on host CPU devices, but JAX's default backend is "
                f"{devices[0].platform!r}; set JAX_PLATFORMS=cpu before JAX starts"
            )
        if len(devices) < needed:
            raise RuntimeError(
                f"SimulatedSlices({slices}, {devices_per_slice}) needs {needed} host "
                f"devices, but JAX has {len(devices)}. Set "
                f"XLA_FLAGS=--xla_force_host_platform_device_count={needed} before JAX starts "
                f"(or elastic_dew.runtime.prepare_process(xla_flags="
                f"'--xla_force_host_platform_device_count={needed}'))"
            )
        devices = devices[:needed]
        slice_to_devices = {
            index: devices[index * devices_per_slice : (index + 1) * devices_per_slice]
            for index in range(slices)
        }
        device_slice = {
            device.id: index for index, slice_devices in slice_to_devices.items() for device in slice_devices
        }
        return cls(slices, devices_per_slice, slice_to_devices, device_slice)

    @property
    def devices(self) -> list[jax.Device]:
        """Every device of every slice, in slice order."""
        return [device for index in sorted(self.slice_to_devices) for device in self.slice_to_devices[index]]

    def slice_of(self, device: jax.Device) -> int | None:
        """The slice a device belongs to, or None for a device outside every slice.

        Args:
            device: a ``jax.Device``.

        Returns:
            Its slice's index, or ``None``.
        """
        return self.device_slice.get(device.id)

    def device_ids(self, slices: frozenset[int] | set[int]) -> frozenset[int]:
        """The ids of every device of ``slices``.

        Args:
            slices: slice indices.

        Returns:
            Their devices' ids.
        """
        return frozenset(device.id for index in slices for device in self.slice_to_devices[index])

    def group(self, devices: Sequence[jax.Device]) -> tuple[dict[int, list[jax.Device]], int]:
        """``get_slice_to_devices``'s answer: ``devices`` by slice, and how many were outside.

        Args:
            devices: the devices to group.

        Returns:
            Each slice's devices among them, and how many were outside every slice.

        Raises:
            ValueError: none of ``devices`` belongs to a slice.
        """
        grouped: dict[int, list[jax.Device]] = {}
        outside = 0
        for device in devices:
            index = self.device_slice.get(device.id)
            if index is None or device.platform != "cpu":
                outside += 1
                continue
            grouped.setdefault(index, []).append(device)
        if not grouped:
            raise ValueError(
                f"none of the {len(devices)} devices belongs to a simulated slice; the simulated "
                f"slices are CPU devices {sorted(self.device_slice)}"
            )
        return dict(sorted(grouped.items())), outside


def check_slice_index(index: int, slices: int) -> None:
    """Refuse a slice index outside ``0 .. slices - 1``: the one check of a slice's index, for
    the simulator's fault controls.

    Args:
        index: a slice index.
        slices: how many slices there are.

    Raises:
        ValueError: it is not one of the slices.
    """
    if not isinstance(index, int) or not 0 <= index < slices:
        raise ValueError(f"slice {index!r} does not exist; slices are 0..{slices - 1}")
