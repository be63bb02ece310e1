"""`virtbus domxml`: show the libvirt domain a VMI or VM manifest would become.

Lets a person check what the agent will define before launching anything; a manifest
the control plane would refuse is refused here with the same field and rule.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import TYPE_CHECKING, TypeVar

import msgspec
import yaml

from events.api.errors import InvalidSpec
from events.api.validation import validate_vmi_spec
from events.api.vm import VirtualMachineInstanceSpec
from nodeagent.converter import ConverterContext, convert
from nodeagent.converter import defaults as converter_defaults
from nodeagent.converter.context import memfd_from_annotations
from nodeagent.converter.unavailable import NotOnThisNode

if TYPE_CHECKING:
    from collections.abc import Mapping

    from nodeagent.converter import DomainType

T = TypeVar("T")

SPEC_PATHS = {"VirtualMachineInstance": ("spec",), "VirtualMachine": ("spec", "template", "spec")}
"""Where each kind keeps the VMI spec."""
VMI_METADATA_PATHS = {
    "VirtualMachineInstance": ("metadata",),
    "VirtualMachine": ("spec", "template", "metadata"),
}
"""Where each kind keeps the VMI's metadata (annotations the converter reads)."""
_MSGSPEC_PATH = re.compile(r"^(?P<rule>.*) - at `\$(?P<where>.*)`$")


def _decode(raw: object, kind: type[T], path: str) -> T:
    """msgspec's conversion, with its errors restated as InvalidSpec at a manifest path."""
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as error:
        match = _MSGSPEC_PATH.match(str(error))
        if match is None:
            raise InvalidSpec(path, str(error)) from None
        raise InvalidSpec(path + match["where"], match["rule"]) from None


def _mapping(value: object, path: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise InvalidSpec(path, "must be an object")
    return value


def _walk(doc: Mapping[str, object], keys: tuple[str, ...]) -> dict[str, object]:
    """The object at `keys` under doc ({} where absent); a non-object on the way is refused."""
    found: object = doc
    for depth, key in enumerate(keys):
        found = _mapping(found, ".".join(keys[:depth]) or "manifest").get(key, {})
    return _mapping(found, ".".join(keys))


def render_manifest(
    doc: Mapping[str, object],
    *,
    domain_type: DomainType = "kvm",
    default_cpu_model: str = "",
    disk_dir: str = converter_defaults.DISK_DIR,
) -> str:
    """Domain XML for a parsed VirtualMachineInstance or VirtualMachine manifest."""
    return convert(*parse_manifest(doc, domain_type=domain_type,
                                   default_cpu_model=default_cpu_model, disk_dir=disk_dir))


def parse_manifest(
    doc: Mapping[str, object],
    *,
    domain_type: DomainType = "kvm",
    default_cpu_model: str = "",
    disk_dir: str = converter_defaults.DISK_DIR,
) -> tuple[VirtualMachineInstanceSpec, ConverterContext]:
    """The admitted VMI spec of a manifest and its converter context: what `convert` takes,
    for a caller (the agent's launch) that needs the decoded spec too."""
    kind = doc.get("kind")
    if not isinstance(kind, str) or kind not in SPEC_PATHS:
        raise InvalidSpec("kind", f"must be one of {', '.join(SPEC_PATHS)}")
    metadata = _mapping(doc.get("metadata", {}), "metadata")
    name, namespace, uid = (metadata.get(k, "") for k in ("name", "namespace", "uid"))
    if not isinstance(name, str) or not name:
        raise InvalidSpec("metadata.name", "must be set")
    path = ".".join(SPEC_PATHS[kind])
    vmi_spec = _decode(_walk(doc, SPEC_PATHS[kind]), VirtualMachineInstanceSpec, path)
    annotations = _walk(doc, (*VMI_METADATA_PATHS[kind], "annotations"))
    validate_vmi_spec(vmi_spec, path)
    ctx = ConverterContext(
        name=name,
        namespace=str(namespace or "default"),
        uid=str(uid or ""),
        domain_type=domain_type,
        default_cpu_model=default_cpu_model,
        disk_dir=disk_dir,
        memfd=memfd_from_annotations(annotations),
    )
    return vmi_spec, ctx


def main_domxml(argv: list[str]) -> int:
    """Print the domain XML of every manifest in the files; 1 and a reason on bad input."""
    parser = argparse.ArgumentParser(prog="virtbus domxml", description=__doc__)
    parser.add_argument("-f", "--filename", action="append", required=True, metavar="FILE")
    parser.add_argument("--domain-type", choices=("kvm", "qemu", "test"), default="kvm")
    parser.add_argument("--default-cpu-model", default="", help="HyperConverged defaultCPUModel")
    parser.add_argument("--disk-dir", default=converter_defaults.DISK_DIR)
    args = parser.parse_args(argv)
    try:
        for filename in args.filename:
            with open(filename, encoding="utf-8") as stream:
                documents = [d for d in yaml.safe_load_all(stream) if d is not None]
            for doc in documents:
                sys.stdout.write(
                    render_manifest(
                        _mapping(doc, filename),
                        domain_type=args.domain_type,
                        default_cpu_model=args.default_cpu_model,
                        disk_dir=args.disk_dir,
                    )
                )
    except InvalidSpec as error:
        print(f"error: {error.field}: {error.rule}", file=sys.stderr)
        return 1
    except NotOnThisNode as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except (OSError, yaml.YAMLError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0
