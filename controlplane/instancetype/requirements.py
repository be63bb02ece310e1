"""A preference's `requirements`: the least CPU and memory, and the architecture, a VM
using it must have (KubeVirt's `pkg/instancetype/preference/requirements`), checked on the
expanded spec; a shortfall names the fields and KubeVirt's words."""

from __future__ import annotations

import math
from typing import Final

from events.api.errors import InvalidSpec
from events.api.instancetype import (
    THREADS_PER_CORE,
    VirtualMachineInstancetypeSpec,
    VirtualMachinePreferenceSpec,
    preferred_topology,
    spread_options,
)
from events.api.resources import quantity
from events.api.vm import VirtualMachineInstanceSpec

DEFAULT_ARCHITECTURE: Final = "amd64"
"""What KubeVirt's defaulting gives a VMI that names no architecture (on amd64 clusters)."""
AXES: Final = {"sockets": ("sockets",), "cores": ("cores",), "threads": ("threads",),
               "any": ("cores", "sockets", "threads")}
SPREAD_AXES: Final = {"SocketsCores": ("sockets", "cores"), "CoresThreads": ("cores", "threads"),
                      "SocketsCoresThreads": ("sockets", "cores", "threads")}
AXES_NAMED: Final = {"any": "cores, sockets and threads"}


def check_requirements(instancetype: VirtualMachineInstancetypeSpec | None,
                       preference: VirtualMachinePreferenceSpec | None,
                       spec: VirtualMachineInstanceSpec, path: str) -> None:
    required = preference.requirements if preference is not None else None
    if required is None:
        return
    failure = _Failure(path)
    if required.cpu is not None:
        _check_cpu(instancetype, preference, spec, required.cpu.guest, failure)
    if required.memory is not None:
        want = quantity(required.memory.guest)
        guest = spec.domain.memory.guest if spec.domain.memory is not None else None
        have = quantity(guest) if guest is not None else 0
        if have < want:
            who = "instance type" if instancetype is not None else "VirtualMachine"
            field = "spec.instancetype" if instancetype is not None else f"{path}.domain.memory"
            failure.fail([field], f"insufficient Memory resources of {guest or '0Mi'} provided "
                                  f"by {who}, preference requires {required.memory.guest}")
    if required.architecture is not None:
        arch = spec.architecture or DEFAULT_ARCHITECTURE
        if arch != required.architecture:
            failure.fail([f"{path}.architecture"],
                         f"preference requires architecture {required.architecture} but "
                         f"{arch} is being requested")


class _Failure:
    """Raises KubeVirt's refusal: the fields, and the reason behind its fixed prefix."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, fields: list[str], reason: str) -> None:
        raise InvalidSpec(", ".join(fields), f"failure checking preference requirements: "
                                             f"{reason}")


def _check_cpu(instancetype: VirtualMachineInstancetypeSpec | None,
               preference: VirtualMachinePreferenceSpec | None,
               spec: VirtualMachineInstanceSpec, want: int, failure: _Failure) -> None:
    if instancetype is not None:
        if instancetype.cpu.guest < want:
            failure.fail(["spec.instancetype"],
                         f"insufficient CPU resources of {instancetype.cpu.guest} vCPU provided "
                         f"by instance type, preference requires {want} vCPU")
        return
    at = f"{failure.path}.domain.cpu"
    cpu = spec.domain.cpu
    if cpu is None:
        failure.fail([at], f"no CPU resources provided by VirtualMachine, preference requires "
                           f"{want} vCPU")
        return
    topology = preferred_topology(preference)
    if topology == "spread":
        _, across = spread_options(preference)
        axes, named = SPREAD_AXES[across], across
    else:
        axes, named = AXES[topology], AXES_NAMED.get(topology, topology)
    have = math.prod(getattr(cpu, axis) for axis in axes)
    if have < want:
        failure.fail([f"{at}.{axis}" for axis in axes],
                     f"insufficient CPU resources of {have} vCPU provided by VirtualMachine, "
                     f"preference requires {want} vCPU provided as {named}")


def check_spread(instancetype: VirtualMachineInstancetypeSpec | None,
                 preference: VirtualMachinePreferenceSpec | None) -> None:
    """KubeVirt's `CheckSpreadCPUTopology`: a spread topology must divide the instancetype's
    vCPUs evenly."""
    if instancetype is None or preferred_topology(preference) != "spread":
        return
    vcpus = instancetype.cpu.guest
    ratio, across = spread_options(preference)
    match across:
        case "SocketsCores" if vcpus % ratio:
            reason = (f"{vcpus} vCPUs provided by the instance type are not divisible by the "
                      f"Spec.PreferSpreadSocketToCoreRatio or Spec.CPU.PreferSpreadOptions.Ratio "
                      f"of {ratio} provided by the preference")
        case "CoresThreads" if vcpus % ratio:
            reason = (f"{vcpus} vCPUs provided by the instance type are not divisible by the "
                      f"number of threads per core {ratio}")
        case "SocketsCoresThreads" if vcpus % THREADS_PER_CORE or \
                (vcpus // THREADS_PER_CORE) % ratio:
            reason = (f"{vcpus} vCPUs provided by the instance type are not divisible by the "
                      f"number of threads per core {THREADS_PER_CORE} and "
                      f"Spec.PreferSpreadSocketToCoreRatio or Spec.CPU.PreferSpreadOptions.Ratio "
                      f"of {ratio}")
        case _:
            return
    raise InvalidSpec("instancetype.spec.cpu.guest", reason)
