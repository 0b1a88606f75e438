"""Signed report bundles: files + an in-toto Statement v1 in a DSSE envelope, signed with Ed25519.

Layout of a bundle directory ``KVG-YYYYMMDD-xxxxxxxx/``:
  attestation.dsse.json   DSSE envelope; its payload is the in-toto statement (base64)
  signatures/*.dsse.json  signing records of co-signatures (harness.report.dsse, kvgate cosign); not subjects
  <every other file>      one subject each in the statement, with its sha256
The report ID is derived from the sha256 of the statement payload, so it names exactly one content.
The bundle is assembled under a temporary name and renamed into place only when complete.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shlex
import shutil
import stat
import tarfile
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..errors import BundleError
from ..safeio import (MAX_JSON_BYTES, MAX_KEY_BYTES, InputFileError, check_keys, decode_utf8, json_type, parse_json,
                      read_bytes)
from .dsse import (PAYLOAD_TYPE, STATEMENT_KEYS, STATEMENT_TYPE, check_signing_records, decode_signatures,
                   is_record_path, key_fingerprint, pae, read_envelope_file, write_signing_record)
from .dsse import canonical as _canonical

PREDICATE_TYPE = "https://kvgate.dev/acceptance-report/v1"
ENVELOPE = "attestation.dsse.json"
_CHUNK = 1 << 20


def generate_keypair(prefix: str | Path) -> tuple[Path, Path]:
    """Write PREFIX.key (PKCS8 PEM, mode 0600) and PREFIX.pub (SubjectPublicKeyInfo PEM)."""
    prefix = Path(prefix)
    key_path, pub_path = Path(f"{prefix}.key"), Path(f"{prefix}.pub")
    if key_path.exists():
        raise BundleError(f"{key_path} exists; refusing to overwrite a private key")
    key_path.parent.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub_path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                       serialization.PublicFormat.SubjectPublicKeyInfo))
    return key_path, pub_path


def _read_key(path: str | Path) -> bytes:
    try:
        return read_bytes(path, max_bytes=MAX_KEY_BYTES, what="key file")
    except InputFileError as exc:
        raise BundleError(str(exc)) from None


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    """The Ed25519 signing key at ``path``. As ssh does with its keys, a key file that group or others may
    read or write is refused (anyone who could read it could sign as its owner), naming the chmod to run."""
    data = _read_key(path)  # a regular file within the size limit, or BundleError naming it
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise BundleError(f"{path}: not a readable unencrypted PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise BundleError(f"{path}: expected an Ed25519 key")
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise BundleError(f"{path}: {exc.strerror}") from None
    if mode & 0o077:
        raise BundleError(f"{path}: private key is accessible by group or others (mode {stat.S_IMODE(mode):04o}); "
                          f"a signing key must be private to its owner: run chmod 600 {shlex.quote(str(path))}")
    return key


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(_read_key(path))
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise BundleError(f"{path}: not a readable PEM public key: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise BundleError(f"{path}: expected an Ed25519 public key")
    return key


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _list_files(root: Path) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for fn in sorted(filenames):
            p = Path(dirpath) / fn
            if p.is_symlink():
                raise BundleError(f"{p}: symlinks are not allowed in a bundle")
            out.append(p.relative_to(root).as_posix())
    return sorted(out)


def evidence_digest(subjects: list[dict], predicate: dict[str, Any]) -> str:
    """sha256 of the evidence part of a statement: every subject except the rendered reports, and the
    predicate without the fields that carry the ID. The report ID is derived from it, so the rendered
    reports can print the ID and still be signed subjects themselves."""
    rendered = set(predicate.get("rendered_files", []))
    core = {
        "subject": [s for s in subjects if s["name"] not in rendered],
        "predicate": {k: v for k, v in predicate.items() if k not in ("report_id", "rendered_files")},
    }
    return hashlib.sha256(_canonical(core)).hexdigest()


def report_id_for(digest_hex: str, created_utc: str) -> str:
    return f"KVG-{created_utc[:10].replace('-', '')}-{digest_hex[:8]}"


def _copy_hashing(src: Path, dst: Path) -> str:
    h = hashlib.sha256()
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        while chunk := fi.read(_CHUNK):
            h.update(chunk)
            fo.write(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class BundleInfo:
    path: Path
    tar_path: Path | None
    report_id: str


def write_bundle(run_dir: str | Path, out_dir: str | Path, private_key: Ed25519PrivateKey,
                 predicate: dict[str, Any], make_tar: bool = True,
                 render: Callable[[str, Path], list[str]] | None = None, move: bool = False,
                 clock: Callable[[], time.struct_time] = time.gmtime) -> BundleInfo:
    """Sign every file under ``run_dir`` into a bundle under ``out_dir``.

    The files go into a hidden temporary directory beside the final one: copied and hashed in one pass, or,
    with ``move=True``, the run directory itself is renamed there (no copy; on any failure it is renamed
    back). ``render`` (given the report ID and that directory) may then write reports that print the ID.
    ``clock`` gives ``created_utc`` (a seam for tests that need bundles of different dates).
    The directory is renamed into place (and tarred) only after the envelope is written.
    """
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [f for f in _list_files(run_dir) if f != ENVELOPE]
    if any(is_record_path(f) for f in files):
        raise BundleError(f"{run_dir}: a top-level signatures/ is reserved for signing records")
    created = clock()
    tmp = Path(tempfile.mkdtemp(prefix=".incomplete-bundle-", dir=out_dir))
    moved = False
    if move:
        try:
            os.rename(run_dir, tmp)
            moved = True
        except OSError:
            pass  # another filesystem: copy instead
    try:
        subjects = []
        for rel in files:
            if moved:
                digest = sha256_file(tmp / rel)
            else:
                dst = tmp / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                digest = _copy_hashing(run_dir / rel, dst)
            subjects.append({"name": rel, "digest": {"sha256": digest}})
        pred = dict(predicate, created_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", created), rendered_files=[])
        report_id = report_id_for(evidence_digest(subjects, pred), pred["created_utc"])
        rendered = sorted(render(report_id, tmp)) if render else []
        for rel in rendered:
            if rel in files:
                raise BundleError(f"rendered file {rel} would replace an evidence file")
            subjects.append({"name": rel, "digest": {"sha256": sha256_file(tmp / rel)}})
        subjects.sort(key=lambda s: s["name"])
        pred["rendered_files"] = rendered
        pred["report_id"] = report_id
        statement = {"_type": STATEMENT_TYPE, "subject": subjects, "predicateType": PREDICATE_TYPE,
                     "predicate": pred}
        payload = _canonical(statement)
        sig = private_key.sign(pae(PAYLOAD_TYPE, payload))
        pub = private_key.public_key()
        envelope = {
            "payloadType": PAYLOAD_TYPE,
            "payload": base64.b64encode(payload).decode(),
            "signatures": [{"keyid": key_fingerprint(pub), "sig": base64.b64encode(sig).decode()}],
        }
        (tmp / ENVELOPE).write_text(json.dumps(envelope, indent=1) + "\n")
        write_signing_record(tmp, private_key, payload, report_id, pred["created_utc"])  # dates this signature
        final = out_dir / report_id
        if final.exists():
            raise BundleError(f"{final} already exists")
        os.chmod(tmp, 0o755)
        os.rename(tmp, final)
    except BaseException:
        if moved:
            keep = set(files)
            for rel in _list_files(tmp):
                if rel not in keep:  # half-written reports or envelope
                    (tmp / rel).unlink()
            os.rename(tmp, run_dir)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    tar_path = tar_bundle(final, out_dir / f"{report_id}.tar.gz") if make_tar else None
    return BundleInfo(final, tar_path, report_id)


def tar_bundle(bundle_dir: Path, tar_path: Path) -> Path:
    """Write ``tar_path`` (one top directory named like ``bundle_dir``) under a hidden temporary name beside
    it, renamed into place (replacing an older one) only when complete."""
    tmp_tar = tar_path.parent / f".incomplete-{tar_path.name}"
    try:
        with tarfile.open(tmp_tar, "w:gz", compresslevel=6) as tf:
            tf.add(bundle_dir, arcname=bundle_dir.name)
        os.rename(tmp_tar, tar_path)
    except BaseException:
        tmp_tar.unlink(missing_ok=True)
        raise
    return tar_path


# A bundle's files unpacked: fio JSON, engine logs and request records of a run are far below this
MAX_EXTRACTED_BYTES = 4 << 30
MAX_ARCHIVE_MEMBERS = 200_000


def extract_archive(tar: Path, into: Path, max_bytes: int | None = None) -> Path:
    """Extract a bundle archive into the directory ``into`` (tar's ``data`` filter: no links out, no devices);
    the one bundle directory it must hold. The members' sizes are summed from their headers before anything
    is written: an archive that would unpack to more than ``max_bytes`` (a gzip bomb), or to more than the
    free space of ``into``, or with more than MAX_ARCHIVE_MEMBERS entries, is refused."""
    max_bytes = MAX_EXTRACTED_BYTES if max_bytes is None else max_bytes
    Path(into).mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(tar, "r:gz") as tf:
            total, count = 0, 0
            for member in tf:  # headers only: a member's data is skipped, not inflated to disk
                count += 1
                total += max(member.size, 0)
                if count > MAX_ARCHIVE_MEMBERS:
                    raise BundleError(f"{tar}: more than {MAX_ARCHIVE_MEMBERS} entries: not a kvgate bundle")
                if total > max_bytes:
                    raise BundleError(f"{tar}: would unpack to more than {max_bytes} bytes (refused: a bundle "
                                      "is far smaller; a compressed bomb fills the disk)")
            free = shutil.disk_usage(into).free
            if total > free:
                raise BundleError(f"{tar}: unpacks to {total} bytes, more than the {free} bytes free in {into}")
            tf.extractall(into, filter="data")
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise BundleError(f"{tar}: not a readable bundle archive: {exc}") from None
    entries = list(Path(into).iterdir())
    if len(entries) != 1 or not entries[0].is_dir():
        raise BundleError(f"{tar}: archive must hold exactly one bundle directory")
    return entries[0]


@contextlib.contextmanager
def open_bundle(path: str | Path) -> Iterator[Path]:
    """A bundle's directory: the directory itself, or a ``.tar.gz`` extracted (:func:`extract_archive`) into a
    temporary directory that lives as long as the ``with`` block."""
    path = Path(path)
    if path.is_dir():
        yield path
        return
    if not path.is_file():
        raise BundleError(f"{path}: no such bundle (expected a directory or a .tar.gz)")
    with tempfile.TemporaryDirectory(prefix="kvgate-bundle-") as td:
        yield extract_archive(path, Path(td))


def read_envelope(env_path: Path) -> tuple[str, bytes, list[dict[str, str]]]:
    """(payloadType, payload bytes, signatures) of a bundle's DSSE envelope, read with the hardened JSON reader
    (no symlink, size cap, UTF-8, no duplicate keys) and checked key by key; InputFileError otherwise."""
    return read_envelope_file(env_path, ENVELOPE, MAX_JSON_BYTES)


_SHA256_HEX = frozenset("0123456789abcdef")


def check_statement(st: Any, name: str) -> None:
    """The shape kvgate signs: an in-toto Statement v1 whose subjects are relative paths inside the bundle
    with sha256 digests, and a predicate object with ``created_utc``. InputFileError naming the first misfit."""
    check_keys(st, STATEMENT_KEYS, name, "statement", root=True)
    if st.get("_type") != STATEMENT_TYPE or st.get("predicateType") != PREDICATE_TYPE:
        raise InputFileError(name, None, f"statement: _type / predicateType are not {STATEMENT_TYPE} / "
                                         f"{PREDICATE_TYPE}")
    subjects, pred = st.get("subject"), st.get("predicate")
    if not isinstance(subjects, list):
        raise InputFileError(name, None, f"statement: subject must be an array, got {json_type(subjects)}")
    seen: set[str] = set()
    for i, sub in enumerate(subjects):
        check_keys(sub, {"name", "digest"}, name, f"subject[{i}]")
        rel, digest = sub.get("name"), sub.get("digest")
        parts = rel.split("/") if isinstance(rel, str) else []
        if not parts or rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or rel == ENVELOPE:
            raise InputFileError(name, None, f"subject[{i}]: name {rel!r} is not a relative path inside the bundle")
        if rel in seen:
            raise InputFileError(name, None, f"subject[{i}]: {rel} is listed twice")
        seen.add(rel)
        check_keys(digest, {"sha256"}, name, f"subject[{i}].digest")
        h = digest.get("sha256")
        if not isinstance(h, str) or len(h) != 64 or not set(h) <= _SHA256_HEX:
            raise InputFileError(name, None, f"subject[{i}]: digest.sha256 is not 64 lowercase hex digits")
    if not isinstance(pred, dict) or not isinstance(pred.get("created_utc"), str):
        raise InputFileError(name, None, "statement: predicate must be an object with created_utc")


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    report_id: str | None
    statement: dict[str, Any] | None
    error: str | None
    signer: str | None = None


def _fail(msg: str, report_id: str | None = None, statement=None) -> VerifyResult:
    return VerifyResult(False, report_id, statement, msg)


def verify_bundle(path: str | Path, pubkey_path: str | Path | None = None,
                  public_key: Ed25519PublicKey | None = None) -> VerifyResult:
    """Check the signature, then every subject digest; reject missing and extra files; check every signing
    record under ``signatures/``."""
    if public_key is None:
        public_key = load_public_key(pubkey_path)  # type: ignore[arg-type]
    return _verify(Path(path), public_key)


def verify_content(path: str | Path) -> VerifyResult:
    """Every file against the statement and every signing record against its own key, checking no
    signature of the statement against a trusted key (``signer`` is None): for callers that judge the
    signatures themselves (harness.report.cosign)."""
    return _verify(Path(path), None)


def _verify(path: Path, public_key: Ed25519PublicKey | None) -> VerifyResult:
    if path.is_file() and path.name.endswith((".tar.gz", ".tgz")):
        try:
            with open_bundle(path) as d:
                return _verify(d, public_key)
        except BundleError as exc:
            return _fail(str(exc))
    env_path = path / ENVELOPE
    if not env_path.exists() and not env_path.is_symlink():
        return _fail(f"{env_path}: missing (not a kvgate bundle)")
    try:
        ptype, payload, sigs = read_envelope(env_path)
    except InputFileError as exc:
        return _fail(str(exc))
    if ptype != PAYLOAD_TYPE:
        return _fail(f"{ENVELOPE}: unexpected payloadType {ptype!r}")
    fp = key_fingerprint(public_key) if public_key is not None else None
    good = False
    for s in sigs if public_key is not None else []:
        try:
            public_key.verify(base64.b64decode(s["sig"], validate=True), pae(ptype, payload))
            good = True
            break
        except (InvalidSignature, ValueError):
            continue
    if public_key is not None and not good:
        return _fail(f"{ENVELOPE}: signature does not verify with key {fp}")
    name = f"{ENVELOPE} payload"
    try:
        statement = parse_json(decode_utf8(payload, name), name)
        check_statement(statement, name)
        subjects = statement["subject"]
        pred = statement["predicate"]
        report_id = report_id_for(evidence_digest(subjects, pred), pred["created_utc"])
    except InputFileError as exc:
        return _fail(f"malformed statement: {exc}")
    if pred.get("report_id") != report_id:
        return _fail(f"{ENVELOPE}: report ID {pred.get('report_id')!r} does not match the statement digest "
                     f"({report_id})", report_id, statement)
    expected = {s["name"]: s["digest"]["sha256"] for s in subjects}
    try:
        present = [f for f in _list_files(path) if f != ENVELOPE and not is_record_path(f)]
    except Exception as exc:  # noqa: BLE001 - e.g. a symlink planted in the bundle
        return _fail(str(exc), report_id, statement)
    for rel in sorted(expected):
        p = path / rel
        try:
            mode = p.lstat().st_mode
        except OSError:
            return _fail(f"{rel}: missing from bundle", report_id, statement)
        if not stat.S_ISREG(mode):
            return _fail(f"{rel}: not a regular file (a signed subject is a file)", report_id, statement)
        try:
            digest = sha256_file(p)
        except OSError as exc:
            return _fail(f"{rel}: cannot read: {exc.strerror or exc}", report_id, statement)
        if digest != expected[rel]:
            return _fail(f"{rel}: sha256 does not match the signed statement", report_id, statement)
    extra = sorted(set(present) - set(expected))
    if extra:
        return _fail(f"{extra[0]}: file not in the signed statement", report_id, statement)
    if path.name.startswith("KVG-") and path.name != report_id:
        return _fail(f"bundle directory name {path.name} does not match report ID {report_id}", report_id, statement)
    try:
        parsed_sigs = decode_signatures(sigs)
    except ValueError as exc:
        return _fail(f"{ENVELOPE}: malformed signatures: {exc}", report_id, statement)
    _, record_error = check_signing_records(path, ptype, payload, parsed_sigs, report_id, pred["created_utc"])
    if record_error:
        return _fail(record_error, report_id, statement)
    return VerifyResult(True, report_id, statement, None, fp)
