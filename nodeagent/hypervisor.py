"""Which domain type a real host's guests get: `kvm` where KVM actually runs a guest, else
`qemu` (TCG, full emulation). (A simulated host's are `test`: `nodeagent.simhost`.)

`/dev/kvm` being there, or libvirt offering `<domain type='kvm'>`, is not enough: on a host
whose (nested) KVM creates a VM but never gets its vCPU into 64-bit mode, a `type='kvm'`
guest is defined, "runs", and stays silent for ever (issue 12: a Linux kernel under KVM here
stops after its real-mode setup). So the agent tries, once at start: it runs the emulator
libvirt would use (the capabilities' `<emulator>`) with `-accel kvm` on `PROBE_FIRMWARE`, a
64 KiB firmware image that does what every x86-64 kernel does first (real mode to protected
mode to long mode, with a GDT and identity-mapped page tables) and then writes one byte to
QEMU's `isa-debug-exit` port, which makes QEMU exit with status `(byte << 1) | 1`. That
status within `--hypervisor-probe-timeout` says KVM runs guests; anything else (no exit,
another status, no emulator, no KVM in libvirt) says it does not, and why is logged.

Overrides: the agent's `--hypervisor kvm|qemu` (no probe) and the cluster's KubeVirt
`developerConfiguration.useEmulation`: in KubeVirt a VMI then asks for no
`devices.kubevirt.io/kvm`, so its launcher has no /dev/kvm and libvirt runs it under TCG;
here the node's guests become `type='qemu'` the same way. Where KubeVirt refuses a VMI on a
host without KVM unless `useEmulation` is set ("kvm not present and emulation is not
allowed"), virtbus falls back to TCG and reports domain type `qemu`, so the scheduler asks
no kvm device of such a node and `virtbus get node` shows why guests are slow.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING, Final, Literal

import structlog

if TYPE_CHECKING:
    from nodeagent.converter import DomainType

log = structlog.get_logger(__name__)

HypervisorChoice = Literal["auto", "kvm", "qemu"]
HYPERVISOR_CHOICES: Final[tuple[HypervisorChoice, ...]] = ("auto", "kvm", "qemu")

PROBE_EXIT_BYTE: Final = 0x2A
PROBE_EXIT_STATUS: Final = (PROBE_EXIT_BYTE << 1) | 1
"""QEMU's exit status once the probe's vCPU wrote `PROBE_EXIT_BYTE` to isa-debug-exit."""
_PROBE_CODE: Final = bytes.fromhex(
    # GNU as source (`as --64`, linked at 0, `objcopy -O binary`):
    #   .code16  cli; cs lgdtl gdt_desc; cr0 |= PE; ljmpl $0x08, $(0xF0000 + pm32)
    #   .code32  pm32: ds = es = ss = 0x10; zero 0x1000..0x4000 (rep stosl);
    #            PML4[0] = 0x2003; PDPT[0] = 0x3003; PD[0] = 0x83 (2 MiB identity page);
    #            cr3 = 0x1000; cr4 |= PAE; EFER |= LME (wrmsr 0xC0000080); cr0 |= PG;
    #            ljmp $0x18, $(0xF0000 + lm64)
    #   .code64  lm64: movb $0x2a, %al; outb %al, $0xf4; hlt
    #   gdt: null, code32 0x00cf9a000000ffff, data 0x00cf92000000ffff,
    #        code64 0x00af9a000000ffff; gdt_desc: .word 31, .long 0xF0000 + gdt
    "fa2e660f0116a8000f20c06683c8010f22c066ea1a000f00080066b810008ed88ec08ed0bf0010000031c0"
    "b9000c0000f3abc7050010000003200000c7050020000003300000c7050030000083000000b8001000000f"
    "22d80f20e083c8200f22e0b9800000c00f320d000100000f300f20c00d000000800f22c0ea81000f001800"
    "b02ae6f4f466900000000000000000ffff0000009acf00ffff00000092cf00ffff0000009aaf001f008800"
    "0f00")
_RESET_VECTOR: Final = 0xFFF0
_RESET_JUMP: Final = bytes.fromhex("ea000000f0")  # ljmp $0xf000, $0 (the code above)
_FIRMWARE_SIZE: Final = 0x10000
_HLT: Final = b"\xf4"
PROBE_FIRMWARE: Final = (_PROBE_CODE + _HLT * (_RESET_VECTOR - len(_PROBE_CODE)) + _RESET_JUMP
                         + _HLT * (_FIRMWARE_SIZE - _RESET_VECTOR - len(_RESET_JUMP)))
"""A BIOS image QEMU maps below 1 MiB and 4 GiB; the vCPU starts at its reset vector."""


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    runs_guests: bool
    why: str


def emulator(caps: ET.Element, domain_type: str) -> str:
    """The emulator libvirt runs for the host architecture's `domain_type` guests ('' when
    libvirt offers none)."""
    arch = caps.findtext("host/cpu/arch", "")
    for guest in caps.iterfind("guest"):
        arch_element = guest.find(f"arch[@name='{arch}']")
        if arch_element is None:
            continue
        for domain in arch_element.iterfind("domain"):
            if domain.get("type") == domain_type:
                return domain.findtext("emulator") or arch_element.findtext("emulator") or ""
    return ""


def probe(emulator_path: str, timeout: float, accel: str = "kvm") -> ProbeResult:
    """Run `PROBE_FIRMWARE` in `emulator_path` under `accel`: does its vCPU reach long
    mode? (`tcg` shows the firmware itself works.)"""
    with tempfile.NamedTemporaryFile(prefix="virtbus-kvm-probe-", suffix=".bin") as firmware:
        firmware.write(PROBE_FIRMWARE)
        firmware.flush()
        command = [emulator_path, "-accel", accel, "-machine", "pc", "-m", "16",
                   "-nodefaults", "-no-user-config", "-display", "none",
                   "-bios", firmware.name, "-device", "isa-debug-exit,iobase=0xf4,iosize=0x04"]
        try:
            done = subprocess.run(command, capture_output=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return ProbeResult(False, f"a {accel} guest did not reach long mode in {timeout:g} s")
        except OSError as e:
            return ProbeResult(False, f"the emulator did not start: {e}")
    if done.returncode == PROBE_EXIT_STATUS:
        return ProbeResult(True, f"a {accel} guest reached long mode")
    stderr = done.stderr.decode(errors="replace").strip().splitlines()
    return ProbeResult(False, f"the {accel} probe exited {done.returncode}: "
                              f"{stderr[-1] if stderr else 'no message'}")


def kvm_runs_guests(capabilities: str, choice: HypervisorChoice, timeout: float,
                    *, node: str = "") -> bool:
    """Whether this host's guests can be `type='kvm'`: as told by `--hypervisor kvm|qemu`,
    else as the probe finds (logged with its reason)."""
    if choice != "auto":
        log.info("hypervisor chosen by flag", node=node, hypervisor=choice)
        return choice == "kvm"
    caps = ET.fromstring(capabilities)
    path = emulator(caps, "kvm")
    result = probe(path, timeout) if path else ProbeResult(False, "libvirt offers no KVM")
    log.info("hypervisor probed", node=node, kvm=result.runs_guests, why=result.why,
             emulator=path)
    return result.runs_guests


def guest_owner(capabilities: str, domain_type: str) -> tuple[int, int] | None:
    """The uid and gid QEMU runs `domain_type` guests as (libvirt's DAC base label), who must
    be able to create the guest's sockets; None where libvirt names none."""
    caps = ET.fromstring(capabilities)
    label = caps.findtext(f"host/secmodel[model='dac']/baselabel[@type='{domain_type}']", "")
    match = re.fullmatch(r"\+?(\d+):\+?(\d+)", label)
    return (int(match[1]), int(match[2])) if match else None


@dataclasses.dataclass(frozen=True)
class Hypervisor:
    """The host's finding and the cluster's `useEmulation`: the domain type guests get."""

    kvm: bool
    use_emulation: bool = False

    @property
    def domain_type(self) -> DomainType:
        return "kvm" if self.kvm and not self.use_emulation else "qemu"
