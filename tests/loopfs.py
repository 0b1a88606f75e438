"""A file system of a test's own: ext4 on a loop device, so a block device's counters are one directory's alone."""

from __future__ import annotations

import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def ext4_on_loop(backing: Path, mountpoint: Path, size: str = "256M") -> Iterator[str]:
    """Make ``backing`` a ``size`` file, ext4 on a loop device of it mounted at ``mountpoint`` (which must exist);
    yields the loop device (/dev/loopN). Unmounted and detached on the way out, whatever happened."""
    subprocess.run(["truncate", "-s", size, str(backing)], check=True)
    loop = subprocess.run(["losetup", "--find", "--show", str(backing)], check=True, capture_output=True,
                          text=True).stdout.strip()
    mounted = False
    try:
        subprocess.run(["mkfs.ext4", "-q", "-F", loop], check=True, capture_output=True)
        subprocess.run(["mount", loop, str(mountpoint)], check=True)
        mounted = True
        yield loop
    finally:
        if mounted:
            subprocess.run(["umount", str(mountpoint)], capture_output=True)
        subprocess.run(["losetup", "-d", loop], capture_output=True)
