"""The node's image store: container images' files, keyed by image reference.

KubeVirt's virt-handler mounts a `containerDisk` (or `kernelBoot.container`) image that the
container runtime pulled; a virtbus node has no runtime, so each image it can run is a
directory under `--image-dir`, `<dir>/<reference, percent-encoded>/`, holding the files the
image would hold: its disk in `/disk/` (KubeVirt's convention for containerDisks), a kernel
and initrd wherever `kernelPath` / `initrdPath` name them. `import-image REF FILE [--path P]`
puts a file there (`P` defaults to `/disk/<FILE's name>`), atomically.

A reference comes from a manifest: it must be one by the OCI distribution grammar
(`REFERENCE`, from distribution/reference), which has no `/` at either end, no `..` and no
empty component; encoded, it is one file name. A path inside the image is resolved as
KubeVirt resolves it (`containerdisk.GetImage`: relative to the image's root, symlinks
included) and must stay inside the image. Either breach is refused with the field and the
rule; an image or file that is not there is `ImageMissing`, which fails the launch with why.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile
import urllib.parse
from pathlib import Path
from typing import Final

import structlog

from events.api.errors import InvalidSpec, VirtbusError

log = structlog.get_logger(__name__)

DISK_DIR_IN_IMAGE: Final = "/disk"
"""Where a containerDisk image keeps its one disk when the volume names no `path`
(KubeVirt's DiskSourceFallbackPath)."""
MAX_REFERENCE_LENGTH: Final = 255
"""distribution/reference's NameTotalLengthMax, for the name; the whole is held to it too."""

_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
REFERENCE: Final = re.compile(
    rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?")
"""An image reference (distribution/reference's ReferenceRegexp)."""


class ImageMissing(VirtbusError):
    """The image, or a file it should hold, is not in this node's store: the VMI cannot run
    here without it."""


def check_reference(field: str, reference: str) -> None:
    """Refuse what is not an image reference (`InvalidSpec` with the field and the rule)."""
    if len(reference) > MAX_REFERENCE_LENGTH or REFERENCE.fullmatch(reference) is None:
        raise InvalidSpec(field, "must be an image reference ([registry/]name[:tag][@digest], "
                                 f"at most {MAX_REFERENCE_LENGTH} characters); got "
                                 f"{reference[:MAX_REFERENCE_LENGTH]!r}")


def _inside(field: str, root: Path, path_in_image: str) -> Path:
    """`path_in_image` under `root`, symlinks resolved, refused if it leaves `root`."""
    if "\0" in path_in_image:
        raise InvalidSpec(field, "must be a path inside the image; it holds a NUL byte")
    root = root.resolve()
    resolved = (root / path_in_image.lstrip("/")).resolve()
    if resolved == root or not resolved.is_relative_to(root):
        raise InvalidSpec(field, f"must be a path inside the image; {path_in_image!r} "
                                 "leaves it")
    return resolved


@dataclasses.dataclass(frozen=True)
class ImageStore:
    root: str

    def image_root(self, field: str, reference: str) -> Path:
        """The directory of an image (checked reference; it may not exist)."""
        check_reference(field, reference)
        return Path(self.root, urllib.parse.quote(reference, safe=""))

    def resolve(self, field: str, reference: str, path_in_image: str = "",
                path_field: str = "") -> str:
        """The file at `path_in_image` (given at `path_field`) in the image, or the one file
        in its `/disk`, as KubeVirt's GetImage finds it; `ImageMissing` when it is not there."""
        root = self.image_root(field, reference)
        if not root.is_dir():
            raise ImageMissing(
                f"{field}: image {reference!r} is not in this node's image store "
                f"({self.root}); import it: virtbus node import-image {reference} FILE")
        if path_in_image:
            found = _inside(path_field or field, root, path_in_image)
            if not found.is_file():
                raise ImageMissing(f"{path_field or field}: image {reference!r} has no file "
                                   f"{path_in_image!r}")
            return str(found)
        disk_dir = _inside(field, root, DISK_DIR_IN_IMAGE)
        files = sorted(disk_dir.iterdir()) if disk_dir.is_dir() else []
        if not files:
            raise ImageMissing(f"{field}: image {reference!r}: no file found in folder "
                               f"{DISK_DIR_IN_IMAGE}, no disk present")
        if len(files) > 1:
            raise ImageMissing(f"{field}: image {reference!r}: more than one file found in "
                               f"folder {DISK_DIR_IN_IMAGE}, only one disk is allowed")
        return str(_inside(field, root, f"{DISK_DIR_IN_IMAGE}/{files[0].name}"))

    def import_file(self, reference: str, source: str, path_in_image: str = "") -> str:
        """Copy `source` into the image (a new image if it is the first file) at
        `path_in_image`, default `/disk/<source's name>`; replaces a file there atomically
        (a temporary file, then a rename). Returns where it is."""
        root = self.image_root("reference", reference)
        target = _inside("--path", root, path_in_image
                         or f"{DISK_DIR_IN_IMAGE}/{os.path.basename(source)}")
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        descriptor, staging = tempfile.mkstemp(dir=target.parent, prefix=".import-")
        try:
            with os.fdopen(descriptor, "wb") as out, open(source, "rb") as src:
                shutil.copyfileobj(src, out)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(staging, 0o644)
            os.replace(staging, target)
        except BaseException:
            Path(staging).unlink(missing_ok=True)
            raise
        log.info("image imported", reference=reference, file=str(target))
        return str(target)
