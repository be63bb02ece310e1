"""Named defaults of the converter, each stated once (KubeVirt's value unless a seed says)."""

from __future__ import annotations

from typing import Final

ARCH: Final = "x86_64"
MACHINE_TYPE: Final = "q35"
"""KubeVirt defaults to QEMU's newest q35 machine type."""
OS_TYPE: Final = "hvm"

HOST_MODEL: Final = "host-model"
HOST_PASSTHROUGH: Final = "host-passthrough"
HOST_CPU_MODES: Final = (HOST_MODEL, HOST_PASSTHROUGH)
CPU_FEATURE_POLICY: Final = "require"
"""A CPU feature without a policy is required (seed)."""

VIDEO_MODEL: Final = "vga"
VIDEO_VRAM_KIB: Final = 16 * 1024
"""The default video device is VGA with 16 MiB of memory (seed)."""

DISK_BUS: Final = "virtio"
CDROM_BUS: Final = "sata"
INPUT_BUS: Final = "usb"
"""An input device without a bus goes on USB (seed)."""

RNG_BACKEND: Final = "/dev/urandom"

SMBIOS_MANUFACTURER: Final = "KubeVirt"
SMBIOS_PRODUCT: Final = "None"
SMBIOS_FAMILY: Final = "KubeVirt"

OVMF_DIR: Final = "/usr/share/OVMF"
EFI_CODE: Final = "OVMF_CODE.fd"
EFI_VARS: Final = "OVMF_VARS.fd"
EFI_SECURE_CODE: Final = "OVMF_CODE.secboot.fd"
EFI_SECURE_VARS: Final = "OVMF_VARS.secboot.fd"

DISK_DIR: Final = "/var/lib/virtbus/disks"
"""Where the agent keeps per-VMI disk images: `<dir>/<namespace>/<name>/<volume>.<ext>`."""
RUN_DIR: Final = "/var/run/virtbus"
"""Where per-VMI sockets (VNC, serial console) live: `<dir>/<namespace>/<name>/`."""
