"""Signed report bundles: files + an in-toto Statement v1 in a DSSE envelope, signed with Ed25519.

Layout of a bundle directory ``KVG-YYYYMMDD-<64 hex>/``:
  attestation.dsse.json   DSSE envelope; its payload is the in-toto statement (base64, canonical JSON)
  signatures/*.dsse.json  signing records of co-signatures (harness.report.dsse, kvgate cosign); not subjects
  <every other file>      one subject each in the statement, with its sha256; regular files only
The report ID (kvgate-report-id/v2) is ``KVG-<date of created_utc>-<sha256 of the ID core>``, the core being
every subject's sha256 taken with the bundle's own ID replaced by ID_PLACEHOLDER (the rendered reports print
the ID) and the predicate without ``report_id``: the ID names exactly one content, every byte of every file,
and a verifier derives it from the files (docs/evidence.md, "What a report ID binds").
The bundle is assembled under a temporary name and renamed into place only when complete.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
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
from .dsse import (PAYLOAD_TYPE, SIGNATURES_DIR, STATEMENT_KEYS, STATEMENT_TYPE, check_signing_records,
                   decode_signatures, is_record_path, key_fingerprint, pae, read_envelope_file, write_signing_record)
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


def walk_tree(root: Path) -> Iterator[tuple[str, int]]:
    """Every entry under ``root`` (bundle-relative path, lstat mode: the type bits alone for a regular file or
    a directory), directories before what they hold, names sorted; no link is followed (a link to a directory
    is an entry, never descended) and nothing is opened.
    Iterative: a deeply nested tree is walked, not a RecursionError."""
    root = Path(root)
    stack: list[tuple[str, list[os.DirEntry]]] = []

    def listing(rel: str) -> list[os.DirEntry]:
        try:
            with os.scandir(root / rel if rel else root) as it:
                return sorted(it, key=lambda e: e.name, reverse=True)
        except OSError as exc:
            raise BundleError(f"{rel or root}: cannot list: {exc.strerror or exc}") from None

    stack.append(("", listing("")))
    while stack:
        rel, entries = stack[-1]
        if not entries:
            stack.pop()
            continue
        e = entries.pop()
        r = f"{rel}/{e.name}" if rel else e.name
        try:
            # the directory entry's own type where the filesystem gives it (no stat call: a bundle of a
            # thousand nodes holds a hundred thousand entries), lstat otherwise (a link, a FIFO, ...)
            mode = (stat.S_IFREG if e.is_file(follow_symlinks=False) else
                    stat.S_IFDIR if e.is_dir(follow_symlinks=False) else e.stat(follow_symlinks=False).st_mode)
        except OSError as exc:
            raise BundleError(f"{r}: cannot stat: {exc.strerror or exc}") from None
        yield r, mode
        if stat.S_ISDIR(mode):
            stack.append((r, listing(r)))


_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def entry_kind(mode: int) -> str:
    """What a non-regular, non-directory entry is, in words."""
    return next((word for test, word in _KINDS if test(mode)), f"a special file (mode {stat.S_IFMT(mode):o})")


_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def _check_name(rel: str) -> None:
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        raise BundleError(f"{rel!r}: a file name that is not UTF-8") from None
    if _CONTROL_RE.search(rel):
        raise BundleError(f"{rel!r}: a file name with a control character")


def tree_entries(root: str | Path) -> tuple[list[str], list[str]]:
    """(regular files, empty directories) of a bundle tree, bundle-relative and sorted: the one walk that
    verify, report, cosign, the library and the writer share. A bundle holds regular files and the directories
    above them, nothing else: a symbolic link (to a directory or a file), a FIFO, a socket or a device anywhere,
    or a name that is not plain UTF-8 text, is a BundleError naming it. Nothing is opened and no link followed.
    The empty directories listed are the innermost ones (a directory with no file under it), except an empty
    top-level ``signatures/`` (the signing-record area, checked by harness.report.dsse)."""
    root = Path(root)
    files: list[str] = []
    dirs: list[str] = []
    for rel, mode in walk_tree(root):
        _check_name(rel)
        if stat.S_ISREG(mode):
            files.append(rel)
        elif stat.S_ISDIR(mode):
            dirs.append(rel)
        else:
            raise BundleError(f"{rel}: {entry_kind(mode)}, not a regular file (a bundle holds only regular files and "
                              "their directories)")
    holding = {"/".join(f.split("/")[:i]) for f in files for i in range(1, f.count("/") + 1)}
    # an empty top-level signatures/ is the record area with no record yet (cosign may leave it so): allowed
    empty = [d for d in dirs if d not in holding and d != SIGNATURES_DIR]
    # a directory with an empty one below it has an empty child on the way: the innermost are no one's parent
    parents = {d.rpartition("/")[0] for d in empty}
    innermost = [d for d in empty if d not in parents]
    return sorted(files), sorted(innermost)


def empty_dir_refusal(rel: str) -> str:
    return f"{rel}/: an empty directory (a bundle holds only the files its statement names)"


def tree_files(root: str | Path, empty_dirs: str = "refuse") -> list[str]:
    """The regular files of :func:`tree_entries`; a directory with no file under it is refused
    (``empty_dirs="refuse"``), left alone (``"ignore"``) or removed (``"remove"``: the writer's own run
    directory)."""
    files, empty = tree_entries(root)
    if empty and empty_dirs == "refuse":
        raise BundleError(empty_dir_refusal(empty[0]))
    if empty_dirs == "remove":
        for d in empty:
            shutil.rmtree(Path(root) / d)  # holds directories only: checked by the walk
    return files


# --------------------------------------------------------------------------- the report ID

#: kvgate-report-id/v2: ``KVG-<YYYYMMDD of created_utc>-<64 hex: the whole sha256 of the ID core>``
ID_SCHEME = "kvgate-report-id/v2"
RID_RE = re.compile(r"^KVG-\d{8}-[0-9a-f]{64}\Z")
OLD_RID_RE = re.compile(r"^KVG-\d{8}-[0-9a-f]{8}\Z")
#: what a bundle's own report ID is replaced with before its files are hashed for the ID (same shape)
ID_PLACEHOLDER = "KVG-00000000-" + "0" * 64
CREATED_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\Z")


def is_report_id(text: Any) -> bool:
    """Whether ``text`` is a report ID of the current format (a safe file name: letters, digits, dashes)."""
    return isinstance(text, str) and bool(RID_RE.match(text))


def old_id_refusal(rid: str) -> str:
    return (f"{rid}: an older report ID format (8 hex digits, which left the rendered reports out of the ID); "
            f"this kvgate verifies only {ID_SCHEME} IDs (KVG-YYYYMMDD-<64 hex>): verify it with the kvgate "
            "that wrote it, or sign its run again")


class PlaceholderFound(BundleError):
    pass


def scan_file(path: Path, report_id: str | None, rel: str | None = None) -> tuple[str, str]:
    """(sha256 of the file, sha256 of the file with every occurrence of ``report_id`` replaced by
    ID_PLACEHOLDER), in one streamed pass; a file that holds the placeholder itself is refused
    (PlaceholderFound), so the replacement can be undone and the ID names one content."""
    ph = ID_PLACEHOLDER.encode()
    rid = report_id.encode() if report_id else None
    n = len(ph)
    raw, norm = hashlib.sha256(), hashlib.sha256()
    pending = b""
    with open(path, "rb") as f:
        while True:
            chunk = f.read(_CHUNK)
            raw.update(chunk)
            pending += chunk
            if ph in pending:
                raise PlaceholderFound(f"{rel or path}: holds the report ID placeholder {ID_PLACEHOLDER}")
            # bytes before ``safe`` cannot begin an occurrence that runs past the end of what was read
            safe = len(pending) if not chunk else max(len(pending) - (n - 1), 0)
            pos = 0
            while rid is not None:
                i = pending.find(rid, pos)
                if i < 0 or i >= safe:
                    break
                norm.update(pending[pos:i])
                norm.update(ph)
                pos = i + n
            cut = max(pos, safe)
            norm.update(pending[pos:cut])
            pending = pending[cut:]
            if not chunk:
                break
    return raw.hexdigest(), norm.hexdigest()


def id_core(normalized: list[tuple[str, str]], predicate: dict[str, Any]) -> bytes:
    """The bytes whose sha256 is the report ID's digest: canonical JSON (sorted keys, no whitespace, ASCII) of
    ``{"scheme", "subject": [{name, digest: {sha256: <normalized sha256>}}] in name order, "predicate": the
    predicate without report_id}``."""
    return _canonical({
        "scheme": ID_SCHEME,
        "subject": [{"name": name, "digest": {"sha256": h}} for name, h in sorted(normalized)],
        "predicate": {k: v for k, v in predicate.items() if k != "report_id"},
    })


def report_id_for(digest_hex: str, created_utc: str) -> str:
    """``KVG-<YYYYMMDD>-<digest>``: the date of ``created_utc`` and the whole sha256 of the ID core."""
    return f"KVG-{created_utc[:10].replace('-', '')}-{digest_hex}"


def derive_report_id(normalized: list[tuple[str, str]], predicate: dict[str, Any]) -> str:
    return report_id_for(hashlib.sha256(id_core(normalized, predicate)).hexdigest(), predicate["created_utc"])


def _copy_hashing(src: Path, dst: Path) -> str:
    h = hashlib.sha256()
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        while chunk := fi.read(_CHUNK):
            h.update(chunk)
            fo.write(chunk)
    return h.hexdigest()


def _scrub_hashing(scrub: Callable[[str], bytes], run_dir: Path, tmp: Path, moved: bool, rel: str) -> str:
    """The sha256 of the evidence file ``rel`` as ``scrub`` leaves it (redacted in place where it lies: in ``tmp``
    when the run directory was moved there, else in the run directory, then copied), read once; one that holds
    the ID placeholder is refused as by :func:`scan_file`. Paths as text: no Path object per file."""
    data = scrub(f"{tmp if moved else run_dir}/{rel}")
    if ID_PLACEHOLDER.encode() in data:
        raise PlaceholderFound(f"{rel}: holds the report ID placeholder {ID_PLACEHOLDER}")
    if not moved:
        dst = tmp / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class BundleInfo:
    path: Path
    tar_path: Path | None
    report_id: str


def _evidence_digests(run_dir: Path, tmp: Path, files: list[str], moved: bool,
                      scrub: Callable[[str], bytes] | None) -> dict[str, str]:
    """Each evidence file's sha256 as it lies in ``tmp`` (copied there first unless the run directory was moved
    there; scrubbed in the same pass where ``scrub`` is given)."""
    digests: dict[str, str] = {}
    for rel in files:
        if scrub is not None:
            digests[rel] = _scrub_hashing(scrub, run_dir, tmp, moved, rel)
            continue
        if not moved:
            dst = tmp / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(run_dir / rel, dst)
        digests[rel] = scan_file(tmp / rel, None, rel)[0]
    return digests


def _sign_into(tmp: Path, private_key: Ed25519PrivateKey, digests: dict[str, str], pred: dict[str, Any]) -> None:
    """The in-toto statement over every file's digest with ``pred``, signed into the DSSE envelope in ``tmp``, and
    the signing record that dates this signature."""
    subjects = [{"name": rel, "digest": {"sha256": digests[rel]}} for rel in sorted(digests)]
    statement = {"_type": STATEMENT_TYPE, "subject": subjects, "predicateType": PREDICATE_TYPE, "predicate": pred}
    payload = _canonical(statement)
    sig = private_key.sign(pae(PAYLOAD_TYPE, payload))
    envelope = {
        "payloadType": PAYLOAD_TYPE,
        "payload": base64.b64encode(payload).decode(),
        "signatures": [{"keyid": key_fingerprint(private_key.public_key()), "sig": base64.b64encode(sig).decode()}],
    }
    (tmp / ENVELOPE).write_text(json.dumps(envelope, indent=1) + "\n")
    write_signing_record(tmp, private_key, payload, pred["report_id"], pred["created_utc"])


def _render_reports(tmp: Path, evidence: dict[str, str], pred: dict[str, Any],
                    render: Callable[[str, Path], list[str]] | None) -> tuple[dict[str, str], dict[str, Any]]:
    """(every file's sha256 as signed, ``pred`` with ``rendered_files`` and the derived ``report_id``): the
    reports ``render`` writes into ``tmp``, first with ID_PLACEHOLDER, then with the ID that the evidence and
    those files derive, checked to derive that same ID back (see :func:`write_bundle`)."""
    rendered = sorted(render(ID_PLACEHOLDER, tmp)) if render else []
    for rel in rendered:
        if rel in evidence:
            raise BundleError(f"rendered file {rel} would replace an evidence file")
    pred = dict(pred, rendered_files=rendered)
    # The rendered files as written with the placeholder are what the verifier gets back from the final
    # ones by replacing the ID with the placeholder; evidence files hold neither (the placeholder is
    # refused when the evidence is hashed, and the ID is a digest of them).
    report_id = derive_report_id(list(evidence.items()) + [(rel, sha256_file(tmp / rel)) for rel in rendered],
                                 pred)
    if render and sorted(render(report_id, tmp)) != rendered:
        raise BundleError("the renderer wrote other files for the report ID than for its placeholder")
    digests, normalized = dict(evidence), dict(evidence)
    for rel in rendered:
        digests[rel], normalized[rel] = scan_file(tmp / rel, report_id, rel)
    if derive_report_id(list(normalized.items()), pred) != report_id:
        raise BundleError("the rendered reports print the report ID other than verbatim: the ID would not "
                          "follow from the files")
    return digests, dict(pred, report_id=report_id)


def write_bundle(run_dir: str | Path, out_dir: str | Path, private_key: Ed25519PrivateKey,
                 predicate: dict[str, Any], make_tar: bool = True,
                 render: Callable[[str, Path], list[str]] | None = None, move: bool = False,
                 clock: Callable[[], time.struct_time] = time.gmtime,
                 scrub: Callable[[str], bytes] | None = None) -> BundleInfo:
    """Sign every file under ``run_dir`` into a bundle under ``out_dir``.

    The files go into a hidden temporary directory beside the final one: copied, or, with ``move=True``, the
    run directory itself is renamed there (no copy; on any failure it is renamed back). A symbolic link or a
    special file in the run directory is refused; empty directories are left out. ``render`` (given a report
    ID and that directory) may then write reports that print the ID: it is called twice, first with
    ID_PLACEHOLDER (the files the ID is derived from), then with the derived ID, and the written bundle is
    checked to derive that same ID (docs/evidence.md, "What a report ID binds"). ``clock`` gives
    ``created_utc`` (a seam for tests that need bundles of different dates). ``scrub`` (harness.redact.scrub_read:
    a file's bytes, redacted in place) is applied to every evidence file in the pass that hashes it, so the run
    directory's last scrub and its hashing read each file once; what is signed is the scrubbed bytes.
    The directory is renamed into place (and tarred) only after the envelope is written.
    """
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files, empty = tree_entries(run_dir)
    files = [f for f in files if f != ENVELOPE]
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
        if moved:  # the same tree, walked above: its empty directories are left out of the bundle
            for d in empty:
                shutil.rmtree(tmp / d)
        evidence = _evidence_digests(run_dir, tmp, files, moved, scrub)
        pred = dict(predicate, created_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", created), rendered_files=[])
        digests, pred = _render_reports(tmp, evidence, pred, render)
        report_id = pred["report_id"]
        _sign_into(tmp, private_key, digests, pred)
        final = out_dir / report_id
        if final.exists():
            raise BundleError(f"{final} already exists")
        os.chmod(tmp, 0o755)
        os.rename(tmp, final)
    except BaseException:
        if moved:
            _strip_to(tmp, set(files))
            os.rename(tmp, run_dir)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    tar_path = tar_bundle(final, out_dir / f"{report_id}.tar.gz") if make_tar else None
    return BundleInfo(final, tar_path, report_id)


def _strip_to(root: Path, keep: set[str]) -> None:
    """Remove what signing added to a moved run directory (half-written reports, the envelope): every entry
    but the ``keep`` files, and the directories left empty."""
    entries = list(walk_tree(root))
    for rel, mode in entries:
        if not stat.S_ISDIR(mode) and rel not in keep:
            (root / rel).unlink()
    for rel, mode in reversed(entries):
        if stat.S_ISDIR(mode) and not any(k.startswith(rel + "/") for k in keep):
            shutil.rmtree(root / rel, ignore_errors=True)


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
    if len(entries) != 1 or entries[0].is_symlink() or not entries[0].is_dir():
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
    if not CREATED_RE.match(pred["created_utc"]):
        raise InputFileError(name, None, f"predicate.created_utc {pred['created_utc']!r} is not YYYY-MM-DDTHH:MM:SSZ")
    rendered = pred.get("rendered_files", [])
    if not isinstance(rendered, list) or not all(isinstance(r, str) and r in seen for r in rendered):
        raise InputFileError(name, None, "predicate.rendered_files must list subjects of the statement")


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
    """Check the signature, the statement (canonical, a current-format report ID), the tree (regular files
    only, no empty directory), every subject's digest, no missing or extra file, the report ID derived from
    the files, and every signing record under ``signatures/``."""
    if public_key is None:
        public_key = load_public_key(pubkey_path)  # type: ignore[arg-type]
    return _verify(Path(path), public_key)


def verify_content(path: str | Path) -> VerifyResult:
    """Every file against the statement and every signing record against its own key, checking no
    signature of the statement against a trusted key (``signer`` is None): for callers that judge the
    signatures themselves (harness.report.cosign)."""
    return _verify(Path(path), None)


def _any_signature_verifies(public_key: Ed25519PublicKey, sigs: list[dict[str, str]], ptype: str,
                            payload: bytes) -> bool:
    """Whether any of the envelope's signatures ``sigs`` verifies over the payload with ``public_key`` (one that
    does not, or is not base64, is skipped)."""
    for s in sigs:
        try:
            public_key.verify(base64.b64decode(s["sig"], validate=True), pae(ptype, payload))
            return True
        except (InvalidSignature, ValueError):
            continue
    return False


def _check_files(path: Path, subjects: list[dict[str, Any]], claimed: str) -> tuple[str | None, list[tuple[str, str]]]:
    """The bundle's tree against the signed ``subjects``: (the first refusal, or None and each subject's
    (name, normalized sha256)): regular files only, each digest as signed, no extra file, no empty directory."""
    try:
        present, empty = tree_entries(path)
    except BundleError as exc:  # a link, a FIFO, a device, an odd name
        return str(exc), []
    present = [f for f in present if f != ENVELOPE and not is_record_path(f)]
    expected = {s["name"]: s["digest"]["sha256"] for s in subjects}
    have = set(present)
    normalized = []
    for rel in sorted(expected):
        if rel not in have:
            if (path / rel).is_dir():
                return f"{rel}: a directory, not a regular file (a signed subject is a file)", []
            return f"{rel}: missing from bundle", []
        try:
            digest, norm = scan_file(path / rel, claimed, rel)
        except PlaceholderFound as exc:
            return str(exc), []
        except OSError as exc:
            return f"{rel}: cannot read: {exc.strerror or exc}", []
        if digest != expected[rel]:
            return f"{rel}: sha256 does not match the signed statement", []
        normalized.append((rel, norm))
    extra = sorted(have - set(expected))
    if extra:
        return f"{extra[0]}: file not in the signed statement", []
    if empty:
        return empty_dir_refusal(empty[0]), []
    return None, normalized


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
    if public_key is not None and not _any_signature_verifies(public_key, sigs, ptype, payload):
        return _fail(f"{ENVELOPE}: signature does not verify with key {fp}")
    name = f"{ENVELOPE} payload"
    try:
        statement = parse_json(decode_utf8(payload, name), name)
        check_statement(statement, name)
    except InputFileError as exc:
        return _fail(f"malformed statement: {exc}")
    subjects, pred = statement["subject"], statement["predicate"]
    claimed = pred.get("report_id")
    if not is_report_id(claimed):
        if isinstance(claimed, str) and OLD_RID_RE.match(claimed):
            return _fail(old_id_refusal(claimed), None, statement)
        return _fail(f"{ENVELOPE}: predicate.report_id {str(claimed)[:80]!r} is not a report ID "
                     "(KVG-YYYYMMDD-<64 hex>)", None, statement)
    if _canonical(statement) != payload:
        # the ID hashes the predicate as canonical JSON: what was signed must be exactly those bytes
        return _fail(f"{ENVELOPE}: the statement is not canonical JSON (sorted keys, no whitespace, ASCII)",
                     claimed, statement)
    files_error, normalized = _check_files(path, subjects, claimed)
    if files_error is not None:
        return _fail(files_error, claimed, statement)
    report_id = derive_report_id(normalized, pred)
    if claimed != report_id:
        return _fail(f"{ENVELOPE}: report ID {claimed} does not match its content (the files and the predicate "
                     f"derive {report_id})", claimed, statement)
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
