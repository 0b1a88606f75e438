"""Which key signs a bundle: the operator's ``--key``, or a development key that reports mark as such."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..paths import state_dir
from .bundle import generate_keypair, key_fingerprint, load_private_key


@dataclass(frozen=True)
class SigningKey:
    private: Ed25519PrivateKey
    kind: str                    # "operator" or "development"
    pub_path: Path | None        # known only for the development key
    key_path: Path

    @property
    def fingerprint(self) -> str:
        return key_fingerprint(self.private.public_key())

    def predicate_entry(self) -> dict:
        return {"kind": self.kind, "fingerprint": self.fingerprint}


def resolve_signing_key(key_path: str | Path | None) -> SigningKey:
    """The operator's key when given; otherwise $KVGATE_HOME/dev-signing.key, created on first use."""
    if key_path:
        return SigningKey(load_private_key(key_path), "operator", None, Path(key_path))
    prefix = state_dir() / "dev-signing"
    if not Path(f"{prefix}.key").exists():
        generate_keypair(prefix)
    return SigningKey(load_private_key(f"{prefix}.key"), "development", Path(f"{prefix}.pub"), Path(f"{prefix}.key"))
