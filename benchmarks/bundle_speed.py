#!/usr/bin/env python3
"""Bundle sign + verify throughput divided by `sha256sum` on the same 1 GiB of files (goal >= 0.8).

All files are in the page cache for every side (each side reads them once before timing starts).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.report.bundle import generate_keypair, load_private_key, verify_bundle, write_bundle  # noqa: E402


def make_files(root: Path, total_bytes: int, count: int) -> list[Path]:
    root.mkdir(parents=True)
    per = total_bytes // count
    block = os.urandom(1 << 20)
    out = []
    for i in range(count):
        p = root / "gates" / f"part{i:03d}.bin"
        p.parent.mkdir(exist_ok=True)
        with open(p, "wb") as f:
            for j in range(per >> 20):
                f.write(block[j % 7:] + block[:j % 7])
        out.append(p)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--dir", default="/var/tmp")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kvgate-bundle-bench-", dir=args.dir))
    try:
        total = args.mib << 20
        run = tmp / "run"
        files = make_files(run, total, args.files)
        key, pub = generate_keypair(tmp / "k")
        key = load_private_key(key)
        subprocess.run(["cat"] + [str(f) for f in files], stdout=subprocess.DEVNULL, check=True)  # warm cache

        t0 = time.perf_counter()
        subprocess.run(["sha256sum"] + [str(f) for f in files], stdout=subprocess.DEVNULL, check=True)
        t_sha = time.perf_counter() - t0

        t_ossl = None
        if shutil.which("openssl"):
            t0 = time.perf_counter()
            subprocess.run(["openssl", "dgst", "-sha256"] + [str(f) for f in files], stdout=subprocess.DEVNULL,
                           check=True)
            t_ossl = time.perf_counter() - t0

        t0 = time.perf_counter()
        copy_info = write_bundle(run, tmp / "out-copy", key, {}, make_tar=False)
        t_sign_copy = time.perf_counter() - t0

        t0 = time.perf_counter()
        info = write_bundle(run, tmp / "out", key, {}, make_tar=False, move=True)
        t_sign = time.perf_counter() - t0

        t0 = time.perf_counter()
        res = verify_bundle(info.path, pub)
        t_verify = time.perf_counter() - t0
        assert res.ok, res.error
        shutil.rmtree(copy_info.path)

        gb = total / 1e9
        sha = gb / t_sha
        print(f"data: {args.mib} MiB in {args.files} files")
        print(f"sha256sum:                  {sha:6.3f} GB/s ({t_sha:.2f} s)")
        print(f"sign (run dir moved):       {gb / t_sign:6.3f} GB/s  ratio {gb / t_sign / sha:.3f}")
        print(f"sign (copied + hashed):     {gb / t_sign_copy:6.3f} GB/s  ratio {gb / t_sign_copy / sha:.3f}")
        print(f"verify:                     {gb / t_verify:6.3f} GB/s  ratio {gb / t_verify / sha:.3f}")
        both = 2 * gb / (t_sign + t_verify)
        print(f"sign+verify (2 passes):     {both:6.3f} GB/s  ratio {both / sha:.3f} (goal >= 0.8)")
        if t_ossl:
            # coreutils' sha256sum may lack the CPU's SHA instructions; OpenSSL (as hashlib) uses them
            print(f"openssl dgst -sha256:       {gb / t_ossl:6.3f} GB/s; sign+verify / openssl "
                  f"{both / (gb / t_ossl):.3f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
