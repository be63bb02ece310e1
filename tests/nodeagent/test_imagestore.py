"""The node's image store: files imported under an image reference and found again as
KubeVirt finds a containerDisk's (its path in the image, else the one file in /disk); a
reference or a path that would leave the store or the image is refused with the field and
the rule; a missing image or file is `ImageMissing` with what to do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from events.api.errors import InvalidSpec
from nodeagent.imagestore import ImageMissing, ImageStore, check_reference

FIELD = "spec.volumes[0].containerDisk.image"


@pytest.fixture
def store(tmp_path: Path) -> ImageStore:
    return ImageStore(str(tmp_path / "images"))


def _file(tmp_path: Path, name: str, content: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(content)
    return str(path)


@pytest.mark.parametrize("reference", [
    "quay.io/containerdisks/fedora:39", "fedora", "localhost:5000/os/disk@sha256:" + "a" * 64,
    "registry.example.org/a_b/c-d.e:v1.2-rc_3", "[::1]:5000/x:y"])
def test_image_references_are_accepted(reference: str) -> None:
    check_reference(FIELD, reference)


@pytest.mark.parametrize("reference", [
    "", "..", "../etc", "a/../../b", "/abs/path", "a//b", "a/", "case/UPPER", "a:b:c",
    "x\0y", "a/%2e%2e", "name:" + "t" * 129, "a" * 256])
def test_what_is_no_reference_is_refused_with_the_field_and_rule(reference: str,
                                                                  store: ImageStore) -> None:
    with pytest.raises(InvalidSpec, match="must be an image reference") as refused:
        store.resolve(FIELD, reference)
    assert refused.value.field == FIELD
    with pytest.raises(InvalidSpec, match="must be an image reference"):
        store.import_file(reference, "/dev/null")


def test_an_imported_disk_is_the_images_one_disk(tmp_path: Path, store: ImageStore) -> None:
    stored = store.import_file("example.org/os:1", _file(tmp_path, "os.qcow2", b"v1"))
    assert store.resolve(FIELD, "example.org/os:1") == stored
    assert Path(stored).read_bytes() == b"v1"
    store.import_file("example.org/os:1", _file(tmp_path, "os.qcow2", b"v2"))
    assert Path(stored).read_bytes() == b"v2"  # replaced, no temporary file left beside it
    assert os.listdir(Path(stored).parent) == ["os.qcow2"]


def test_files_at_paths_in_the_image(tmp_path: Path, store: ImageStore) -> None:
    store.import_file("k:1", _file(tmp_path, "vmlinuz", b"kernel"), "/boot/vmlinuz")
    assert Path(store.resolve(FIELD, "k:1", "/boot/vmlinuz")).read_bytes() == b"kernel"
    assert Path(store.resolve(FIELD, "k:1", "boot/../boot/vmlinuz")).read_bytes() == b"kernel"


def test_a_missing_image_says_how_to_import_it(store: ImageStore) -> None:
    with pytest.raises(ImageMissing) as missing:
        store.resolve(FIELD, "no/such:1")
    assert str(missing.value) == (
        f"{FIELD}: image 'no/such:1' is not in this node's image store ({store.root}); "
        "import it: virtbus node import-image no/such:1 FILE")


def test_a_missing_file_and_a_disk_dir_kubevirt_refuses(tmp_path: Path,
                                                        store: ImageStore) -> None:
    store.import_file("k:1", _file(tmp_path, "vmlinuz", b"kernel"), "/boot/vmlinuz")
    with pytest.raises(ImageMissing, match="has no file '/boot/initrd'"):
        store.resolve(FIELD, "k:1", "/boot/initrd")
    with pytest.raises(ImageMissing, match="no file found in folder /disk, no disk present"):
        store.resolve(FIELD, "k:1")
    store.import_file("k:1", _file(tmp_path, "a.img", b"a"))
    store.import_file("k:1", _file(tmp_path, "b.img", b"b"))
    with pytest.raises(ImageMissing, match="more than one file found in folder /disk"):
        store.resolve(FIELD, "k:1")


@pytest.mark.parametrize("path", ["../../../etc/passwd", "/../../x", "/", ".", "a\0b"])
def test_a_path_out_of_the_image_is_refused(tmp_path: Path, store: ImageStore,
                                            path: str) -> None:
    store.import_file("k:1", _file(tmp_path, "vmlinuz", b"kernel"), "/boot/vmlinuz")
    with pytest.raises(InvalidSpec, match="must be a path inside the image") as refused:
        store.resolve("spec.volumes[0].containerDisk.path", "k:1", path)
    assert refused.value.field == "spec.volumes[0].containerDisk.path"
    with pytest.raises(InvalidSpec, match="must be a path inside the image"):
        store.import_file("k:1", "/dev/null", path)


def test_a_symlink_out_of_the_image_is_refused(tmp_path: Path, store: ImageStore) -> None:
    secret = _file(tmp_path, "host-secret", b"secret")
    stored = Path(store.import_file("k:1", _file(tmp_path, "vmlinuz", b"kernel"), "/boot/k"))
    (stored.parent / "escape").symlink_to(secret)
    with pytest.raises(InvalidSpec, match="leaves it"):
        store.resolve(FIELD, "k:1", "/boot/escape")


def test_the_command_line(tmp_path: Path) -> None:
    images = str(tmp_path / "images")
    source = _file(tmp_path, "disk.raw", b"disk")

    def import_image(reference: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "nodeagent", "import-image", reference,
                               source, "--image-dir", images], capture_output=True, text=True,
                              check=False)

    done = import_image("example.org/os:1")
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip().splitlines()[-1]).read_bytes() == b"disk"
    refused = import_image("../os")
    assert refused.returncode == 1
    assert "error: reference: must be an image reference" in refused.stderr
