"""Named defaults of the converter, each stated once (KubeVirt's value unless a seed says)."""

from __future__ import annotations

from typing import Final

from events.api.spec_rules import LUN_BUSES

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

LUN_BUS: Final = LUN_BUSES[0]
"""A lun needs a SCSI controller, the one bus validation lets a lun name (scsi); KubeVirt's
amd64 default for an unset bus is sata, as for any disk (`events.api.vmi_defaults.DISK_BUS`)."""
INPUT_BUS: Final = "usb"
"""An input device without a bus goes on USB (seed)."""
USB_CONTROLLER_MODEL: Final = "qemu-xhci"
"""The USB controller KubeVirt gives a VMI with a USB device (else `model='none'`)."""

MEMFD_ANNOTATION: Final = "kubevirt.io/memfd"
"""KubeVirt's VMI annotation that, set to "false", keeps hugepages off memfd."""
BOOT_MENU_TIMEOUT_MS: Final = 10000
"""`startStrategy: Paused` shows the boot menu this long, time to reach the firmware."""

RNG_BACKEND: Final = "/dev/urandom"

WATCHDOG_MODEL: Final = "i6300esb"
"""The one watchdog KubeVirt admits on amd64."""
WATCHDOG_ACTION: Final = "reset"
"""KubeVirt's defaulting (SetAmd64Watchdog) for a watchdog without an action."""

PR_HELPER_SOCKET: Final = "/var/run/kubevirt/daemons/pr/pr-helper.sock"
"""KubeVirt's qemu-pr-helper socket for `lun.reservation` (reservation.GetPrHelperSocketPath);
a host offering reservations runs qemu-pr-helper listening there."""
GUEST_AGENT_CHANNEL: Final = "org.qemu.guest_agent.0"
"""The virtio-serial port name qemu-guest-agent opens in the guest."""
DOWNWARD_METRICS_CHANNEL: Final = "org.github.vhostmd.1"
"""The virtio-serial port name vhostmd clients open in the guest
(`/dev/virtio-ports/org.github.vhostmd.1`; KubeVirt's DownwardMetricsSerialDeviceName)."""
DOWNWARD_METRICS_SOCKET: Final = "downwardmetrics.sock"
"""The channel's socket in the VMI's socket directory (KubeVirt: downwardmetrics.sock under
/var/run/kubevirt-private/downwardmetrics-channel in the launcher pod)."""

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
