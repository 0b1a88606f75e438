import pytest

from harness.transport.sshd import PrivateSshd


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    """A private sshd on a free 127.0.0.1 port with a temporary host key and an authorized key."""
    server = PrivateSshd(tmp_path_factory.mktemp("sshd")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def signer(tmp_path_factory):
    """A key pair of the module's own: (private key, public key)."""
    from harness.report.bundle import generate_keypair
    return generate_keypair(tmp_path_factory.mktemp("keys") / "signer")
