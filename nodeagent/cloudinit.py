"""cloud-init data sources as KubeVirt writes them (pkg/cloud-init/cloud-init.go), built into
ISO images with pycdlib (a maintained pure-Python ISO 9660 library, so the agent needs no
xorriso; Joliet and Rock Ridge names as KubeVirt's `xorrisofs -joliet -rock`).

| volume               | volume id  | files (the network data's when given)                  |
|----------------------|------------|--------------------------------------------------------|
| cloudInitNoCloud     | `cidata`   | `user-data`, `meta-data`, `network-config`             |
| cloudInitConfigDrive | `config-2` | `openstack/latest/`: `user_data`, `meta_data.json`,    |
|                      |            | `network_data.json`                                    |

NoCloud's `meta-data` is `{"instance-id": <firmware.uuid>, "local-hostname": <hostname>}`
and ConfigDrive's `meta_data.json` is `{"instance_id": "<name>.<namespace>", "hostname":
<hostname>, "uuid": <firmware.uuid>}`, each JSON as Go marshals it. KubeVirt's webhook always
fills `firmware.uuid`; where it is empty the VMI's uid stands in, as for the domain's
`<uuid>` (`nodeagent.converter.identity`). The hostname is `spec.hostname`, else the VMI's
name up to its first dot, at most 63 characters (dns.SanitizeHostname). `secretRef` and
`networkDataSecretRef` need the Secret, which no node agent can read: refused with the field.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from typing import TYPE_CHECKING, Final

import msgspec
import pycdlib

from events.api.errors import InvalidSpec

if TYPE_CHECKING:
    from events.api.domain import CloudInitConfigDriveSource, CloudInitNoCloudSource
    from events.api.vm import VirtualMachineInstanceSpec

NO_CLOUD_VOLUME_ID: Final = "cidata"
CONFIG_DRIVE_VOLUME_ID: Final = "config-2"
CONFIG_DRIVE_DIR: Final = ("openstack", "latest")
HOSTNAME_MAX: Final = 63
"""DNS1123LabelMaxLength."""


class NoCloudMetadata(msgspec.Struct, omit_defaults=True):
    instance_type: str = msgspec.field(default="", name="instance-type")
    instance_id: str = msgspec.field(default="", name="instance-id")
    local_hostname: str = msgspec.field(default="", name="local-hostname")


class ConfigDriveMetadata(msgspec.Struct, omit_defaults=True):
    instance_type: str = ""
    instance_id: str = ""
    local_hostname: str = ""
    hostname: str = ""
    uuid: str = ""


def hostname(spec: VirtualMachineInstanceSpec, name: str) -> str:
    return spec.hostname or name.split(".", maxsplit=1)[0][:HOSTNAME_MAX]


def _text(field: str, plain: str, encoded: str) -> str:
    """KubeVirt's readCloudInitData: the plain text, else the base64 one decoded."""
    if plain or not encoded:
        return plain
    try:
        return base64.b64decode(encoded, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError) as e:
        raise InvalidSpec(field + "Base64", f"must be base64 of UTF-8 text: {e}") from None


def _data(field: str, source: CloudInitNoCloudSource | CloudInitConfigDriveSource
          ) -> tuple[bytes, bytes]:
    """(user data, network data) of a source; a Secret reference is refused."""
    for ref in ("secret_ref", "network_data_secret_ref"):
        if getattr(source, ref) is not None:
            camel = "secretRef" if ref == "secret_ref" else "networkDataSecretRef"
            raise InvalidSpec(f"{field}.{camel}", "needs a Secret, which this node cannot read; "
                                                  "give the data inline")
    user = _text(f"{field}.userData", source.user_data, source.user_data_base64)
    network = _text(f"{field}.networkData", source.network_data, source.network_data_base64)
    if not user and not network:
        raise InvalidSpec(field, "UserData or NetworkData is required for cloud-init data source")
    return user.encode(), network.encode()


def no_cloud_iso(field: str, source: CloudInitNoCloudSource, *, instance_id: str,
                 host: str) -> bytes:
    user, network = _data(field, source)
    meta = msgspec.json.encode(NoCloudMetadata(instance_id=instance_id, local_hostname=host))
    files = {"user-data": user, "meta-data": meta}
    if network:
        files["network-config"] = network
    return _iso(NO_CLOUD_VOLUME_ID, (), files)


def config_drive_iso(field: str, source: CloudInitConfigDriveSource, *, name: str,
                     namespace: str, uuid: str, host: str) -> bytes:
    user, network = _data(field, source)
    meta = msgspec.json.encode(ConfigDriveMetadata(instance_id=f"{name}.{namespace}",
                                                   hostname=host, uuid=uuid))
    files = {"user_data": user, "meta_data.json": meta}
    if network:
        files["network_data.json"] = network
    return _iso(CONFIG_DRIVE_VOLUME_ID, CONFIG_DRIVE_DIR, files)


def _iso_name(name: str) -> str:
    """An ISO 9660 (level 3) name: d-characters only; Rock Ridge and Joliet keep the real
    one, which is what Linux and cloud-init read."""
    return re.sub(r"[^A-Z0-9_]", "_", name.upper())


def _iso(volume_id: str, directory: tuple[str, ...], files: dict[str, bytes]) -> bytes:
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, joliet=3, rock_ridge="1.09", vol_ident=volume_id)
    parent = iso_parent = ""
    for component in directory:
        parent, iso_parent = f"{parent}/{component}", f"{iso_parent}/{_iso_name(component)}"
        iso.add_directory(iso_parent, rr_name=component, joliet_path=parent)
    for file_name, content in files.items():
        stem, _, extension = file_name.partition(".")
        iso_path = f"{iso_parent}/{_iso_name(stem)}.{_iso_name(extension)};1"
        iso.add_fp(io.BytesIO(content), len(content), iso_path, rr_name=file_name,
                   joliet_path=f"{parent}/{file_name}")
    out = io.BytesIO()
    iso.write_fp(out)
    iso.close()
    return out.getvalue()
