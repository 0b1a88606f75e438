import shutil
import time

import pytest

from harness.errors import TransportError
from harness.rigs import guest as G
from harness.transport import SSHTransport
from harness.transport.sshd import PrivateSshd


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    """A private sshd on a free 127.0.0.1 port with a temporary host key and an authorized key."""
    server = PrivateSshd(tmp_path_factory.mktemp("sshd")).start()
    yield server
    server.stop()


def guest_ssh(state: G.GuestState, deadline_s: float = 300) -> SSHTransport:
    """SSH into the guest: sshd answering its banner is not sshd done with a login under a loaded TCG guest."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return SSHTransport(state.host, state.ssh_port, state.user, state.identity_file,
                                known_hosts_path=state.known_hosts_path, name="guest", connect_timeout_s=60)
        except TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(2)


@pytest.fixture(scope="module")
def qemu_guest(tmp_path_factory):
    """One qemu TCG guest (Debian's kernel) per module that asks for it, reached over SSH: (transport, state,
    state dir). Stopped by PID at the end, also on failure; no qemu booting its initrd may be left running."""
    if shutil.which("qemu-system-x86_64") is None:
        pytest.fail("qemu-system-x86_64 missing: apt-get install qemu-system-x86 (scripts/setup.sh installs it)")
    state_dir = tmp_path_factory.mktemp("qemu-guest") / "guest"
    image = G.build_guest()
    state = G.start_guest(image, state_dir, boot_timeout_s=600)
    tr = None
    try:
        tr = guest_ssh(state)
        yield tr, state, state_dir
    finally:
        if tr is not None:
            tr.close()
        G.stop_guest(state_dir)
        assert state.pid not in G.qemu_pids(str(image.initrd_path)), "qemu left running"


@pytest.fixture(scope="session")
def vllm_model(tmp_path_factory):
    """The random-weight model the vLLM tests serve, built once for the session (tests/integration/vllm_engines.py)."""
    from vllm_engines import build_model
    return build_model(tmp_path_factory.mktemp("vllm-model"))


@pytest.fixture(scope="session")
def vllm_wide_model(tmp_path_factory):
    """The wider random-weight model the vLLM gain and hand-off gates serve (vllm_engines.WIDE_GATE's), built once
    for the session."""
    from vllm_engines import WIDE_GATE, build_model, model_config
    return build_model(tmp_path_factory.mktemp("vllm-wide-model"), model_config(WIDE_GATE))


@pytest.fixture(scope="session")
def vllm_attached(tmp_path_factory, vllm_model):
    """One `vllm serve` kvgate did not start (ExampleConnector on its own loop device's ext4, prefix caching on),
    shared by every test that needs only a running vLLM: started once (a vLLM start-up is the dearest thing these
    tests pay), each user waiting until it answers (an attach test restarts it); stopped at the session's end."""
    from vllm_engines import start_attached
    yield from start_attached(tmp_path_factory.mktemp("attached-vllm"), vllm_model)


@pytest.fixture(scope="session")
def g2_cpu_reference_shipped(tmp_path_factory):
    """One run of gates/g2-cpu-reference.yaml exactly as the README's table gives it (inventory/localhost.yaml;
    both its gates, G2 and the informational G2-multiturn), shared by the modules that check each gate: the run, its
    bundle directory and the development key's public half that signed it. Both modules are in the engine lane
    (tests/lanes.py), so one worker runs it once."""
    from kvgate_cli import readme_run
    
    d = tmp_path_factory.mktemp("g2-cpu-reference-shipped")
    r, bundle, work = readme_run("g2-cpu-reference.yaml", "localhost.yaml", d, timeout=900)
    return r, bundle, d / "home" / "dev-signing.pub"
