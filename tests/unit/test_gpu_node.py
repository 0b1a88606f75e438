"""scripts/gpu-check.sh's probes and what kvgate makes of them: ``nvidia-smi -q`` (captured on real H200, H100,
A100 and GH200 machines), each PCI device's NUMA node, the engine interpreter's probe (captured here on a CPU
torch; GPU cases handwritten in the probe's format, tests/fixtures/gpu/README.md), the pairing verdict with what
the node needs, the inventory written for the node and the figures read back from a bundle."""

import dataclasses
import shlex
from pathlib import Path

import pytest
import yaml

from harness.config import load_config
from harness.parsers.gpu import (NVIDIA_SMI_Q, PCI_NUMA, SmiReport, check_pairing, parse_h2d, parse_nvidia_smi_q,
                                 parse_pci_numa, parse_torch_probe, pcie_ceiling_gb_s)
from harness.rigs.gpunode import GATE_IDS, figures_text, gate_notes, gpu_figures, gpu_inventory
from harness.workloads import WORKLOADS

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "gpu"


def smi(name: str) -> SmiReport:
    return parse_nvidia_smi_q((FIX / f"nvidia-smi-q-{name}.txt").read_text())


def probe(name: str):
    return parse_torch_probe((FIX / f"torch-probe-{name}.out").read_text())


@pytest.mark.parametrize("name, driver, cuda, count, gpu0, bus0, mem_mib, gen, width, c2c", [
    ("h200-550.90.12", "550.90.12", "12.4", 1, "NVIDIA H200", "00000000:03:00.0", 143771, 5, 16, False),
    ("8xh100-565.57.01", "565.57.01", "12.7", 8, "NVIDIA H100 80GB HBM3", "00000000:18:00.0", 81559, 5, 16, False),
    ("4xa100-555.42.02", "555.42.02", "12.5", 4, "NVIDIA A100-SXM4-80GB", "00000000:68:00.0", 81920, 4, 16, False),
    ("gh200-550.127.05", "550.127.05", "12.4", 1, "NVIDIA GH200 480GB", "00000000:DD:00.0", 97871, 4, 1, True),
])
def test_nvidia_smi_q_of_real_machines(name, driver, cuda, count, gpu0, bus0, mem_mib, gen, width, c2c):
    r = smi(name)
    assert (r.driver_version, r.cuda_version, len(r.gpus)) == (driver, cuda, count)
    g = r.gpus[0]
    assert (g.index, g.name, g.bus_id, g.memory_total_mib) == (0, gpu0, bus0, mem_mib)
    assert (g.pcie_gen_max, g.pcie_width_max, g.c2c) == (gen, width, c2c)
    assert [x.index for x in r.gpus] == list(range(count))


def test_eight_h100s_in_bus_order_with_sysfs_addresses_and_pcie_ceilings():
    r = smi("8xh100-565.57.01")
    assert [g.pci_address for g in r.gpus] == [f"0000:{b}:00.0" for b in
                                               ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")]
    # gen 5 x16: 32 GT/s, 128b/130b, per direction
    assert r.gpus[7].pcie_ceiling_gb_s == pytest.approx(63.015, abs=0.001)
    assert smi("4xa100-555.42.02").gpus[0].pcie_ceiling_gb_s == pytest.approx(31.508, abs=0.001)
    # GH200: the GPU is reached over NVLink-C2C; its PCIe x1 is not the host path, so no PCIe ceiling
    assert smi("gh200-550.127.05").gpus[0].pcie_ceiling_gb_s is None


def test_pcie_ceiling_by_generation():
    assert pcie_ceiling_gb_s(3, 16) == pytest.approx(15.754, abs=0.001)
    assert pcie_ceiling_gb_s(6, 16) == pytest.approx(121.0)
    assert pcie_ceiling_gb_s(None, 16) is None and pcie_ceiling_gb_s(7, 16) is None


@pytest.mark.parametrize("text", [
    "",
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
    "NVIDIA driver is installed and running.\n",
])
def test_what_is_not_an_nvidia_smi_report_is_refused(text):
    with pytest.raises(ValueError, match="Driver Version"):
        parse_nvidia_smi_q(text)


def test_a_report_that_lists_fewer_gpus_than_it_says_are_attached_is_refused():
    text = (FIX / "nvidia-smi-q-8xh100-565.57.01.txt").read_text()
    cut = text[:text.index("GPU 00000000:2A:00.0")]
    with pytest.raises(ValueError, match="8 GPU.*describes 1"):
        parse_nvidia_smi_q(cut)


def test_pci_numa_nodes():
    assert set(parse_pci_numa((FIX / "pci-numa-vm-no-gpu.out").read_text()).values()) == {None}  # -1: no affinity
    numa = parse_pci_numa((FIX / "pci-numa-8xh100-handwritten.out").read_text())
    assert [numa[g.pci_address] for g in smi("8xh100-565.57.01").gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_the_probe_of_this_vms_cpu_torch_and_lmcache():
    p = probe("cpu-torch-lmcache-0.5.6")
    assert (p.torch_version, p.torch_cuda, p.cuda_available, p.devices) == ("2.13.0+cpu", None, False, ())
    assert (p.lmcache_version, p.ops_module) == ("0.5.6", "lmcache.cuda_ops")
    assert p.ops_error == "ImportError: libc10_cuda.so: cannot open shared object file: No such file or directory"
    assert "libcudart.so.13" in p.ops_libs and "libtorch_cuda.so" in p.ops_libs
    q = probe("no-torch")
    assert q.torch_error == "ModuleNotFoundError: No module named 'torch'" and q.lmcache_version is None


def test_refused_on_this_vm_with_every_reason_and_what_the_node_needs():
    pr = check_pairing(None, "nvidia-smi not found (rc 127)", probe("cpu-torch-lmcache-0.5.6"), None)
    assert not pr.ok
    text = "\n".join(pr.problems)
    assert "no NVIDIA GPU: nvidia-smi -q: nvidia-smi not found (rc 127)" in text
    assert "torch 2.13.0+cpu" in text and "CPU build" in text
    assert "lmcache.cuda_ops" in text and "libc10_cuda.so" in text
    assert any("CUDA 13.x build of torch" in n and "libcudart.so.13" in n for n in pr.needs)
    assert any("driver whose CUDA Version is 13.0 or later" in n for n in pr.needs)


def test_no_torch_at_all():
    pr = check_pairing(smi("h200-550.90.12"), None, probe("no-torch"), None)
    assert not pr.ok and any("torch does not import" in p for p in pr.problems)


def test_a_driver_older_than_torchs_cuda_is_named_with_both_versions():
    # real 8xH100 report (driver 565.57.01, CUDA 12.7) with a CUDA 13.0 torch
    pr = check_pairing(smi("8xh100-565.57.01"), None, probe("8xh100-cu130-handwritten"), None)
    assert not pr.ok
    assert pr.problems == ("the driver 565.57.01 supports CUDA up to 12.7; torch 2.9.0+cu130 is built for CUDA 13.0",)
    assert pr.needs == ("an NVIDIA driver whose CUDA Version is 13.0 or later, or a torch built for CUDA 12.7 or "
                        "earlier",)


def test_a_cuda_12_torch_against_lmcaches_cuda_13_ops():
    pr = check_pairing(smi("h200-550.90.12"), None, probe("h200-cu128-handwritten"), None)
    text = "\n".join(pr.problems)
    assert "torch 2.8.0+cu128 is built for CUDA 12.8, LMCache 0.5.6's lmcache.cuda_ops for CUDA 13" in text
    assert "the driver 550.90.12 supports CUDA up to 12.4" in text
    assert "libcudart.so.13: cannot open shared object file" in text and "torch built for CUDA 13" in text
    assert "a CUDA 13.x build of torch, or LMCache built for CUDA 12" in pr.needs


def test_a_node_that_pairs():
    good = dataclasses.replace(smi("8xh100-565.57.01"), cuda_version="13.0", driver_version="580.65.06")
    pr = check_pairing(good, None, probe("8xh100-cu130-handwritten"), None)
    assert pr.ok and pr.problems == () and pr.facts["ops_cuda_major"] == 13


def test_torch_seeing_fewer_gpus_than_the_driver_is_a_problem():
    good = dataclasses.replace(smi("8xh100-565.57.01"), cuda_version="13.0")
    p = probe("8xh100-cu130-handwritten")
    pr = check_pairing(good, None, dataclasses.replace(p, devices=p.devices[:4]), None)
    assert not pr.ok and "torch sees 4 GPU(s), nvidia-smi 8 (CUDA_VISIBLE_DEVICES?)" in pr.problems[0]


def test_a_gpu_torch_was_not_built_for_is_a_problem():
    good = dataclasses.replace(smi("8xh100-565.57.01"), cuda_version="13.0")
    p = probe("8xh100-cu130-handwritten")
    p = dataclasses.replace(p, devices=(dataclasses.replace(p.devices[0], capability="10.3"),) + p.devices[1:])
    pr = check_pairing(good, None, p, None)
    assert not pr.ok and "GPU 0 (NVIDIA H100 80GB HBM3, sm_103) is not among torch's architectures" in pr.problems[0]


def test_h2d_probe():
    res, err = parse_h2d((FIX / "h2d-8xh100-handwritten.out").read_text())
    assert err is None and len(res) == 8
    assert res[0].best_gb_s == pytest.approx((1 << 30) / 0.0208 / 1e9)
    assert res[0].median_gb_s == pytest.approx((1 << 30) / 0.0210 / 1e9)
    res, err = parse_h2d((FIX / "h2d-cpu-torch.out").read_text())
    assert res == () and err == "RuntimeError: torch 2.13.0+cpu sees no CUDA device (torch.version.cuda: None)"
    with pytest.raises(ValueError, match="kvgate-gpu-probe"):
        parse_h2d("Traceback (most recent call last):\n")


def test_the_inventory_written_for_a_node_is_one_the_gpu_suite_accepts(tmp_path):
    numa = parse_pci_numa((FIX / "pci-numa-8xh100-handwritten.out").read_text())
    inv = gpu_inventory(smi("8xh100-565.57.01"), numa, work_dir="/var/tmp/kvgate-gpu-check",
                        engine_python="/opt/engine/bin/python")
    node = inv["nodes"][0]
    assert [(g["index"], g["numa_node"]) for g in node["gpus"]] == [(i, 0 if i < 4 else 1) for i in range(8)]
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(inv))
    cfg = load_config(path, ROOT / "gates" / "gpu-node.yaml", WORKLOADS)
    assert [g.id for g in cfg.suite.gates] == [GATE_IDS["fio"], GATE_IDS["kv_read"], GATE_IDS["g2"]]
    assert cfg.inventory.nodes[0].stream_count == 8
    # a GPU with no NUMA affinity (-1) gets none, rather than a wrong one
    lone = gpu_inventory(smi("h200-550.90.12"), {}, work_dir="/w", engine_python="python3")
    assert "numa_node" not in lone["nodes"][0]["gpus"][0]


def test_the_example_inventory_is_what_the_writer_makes():
    example = yaml.safe_load((ROOT / "inventory" / "gpu-node.example.yaml").read_text())
    node = example["nodes"][0]
    written = gpu_inventory(smi("h200-550.90.12"), {"0000:03:00.0": 0}, work_dir=node["work_dir"],
                            engine_python=node["engine_python"])["nodes"][0]
    assert set(written) == set(node) and written["targets"] == [
        dict(t, size="8 GiB") for t in node["targets"]]


def test_figures_from_a_bundle_name_their_gate_and_say_what_was_not_measured():
    verdicts = {"overall": "FAIL", "verdicts": [
        {"gate_id": "G1", "outcome": "PASS", "reason": "", "metrics": {"per_gpu_read_gb_s": 6.1}},
        {"gate_id": "G1C-gpu", "outcome": "PASS", "reason": "", "metrics": {
            "connector_read_gb_s": 5.0, "connector_read_gb_s_mean": 5.4, "fio_read_gb_s": 6.0,
            "connector_efficiency": 0.8333}},
        {"gate_id": "G2", "outcome": "ERROR", "reason": "vLLM did not start", "metrics": {}},
    ]}
    h2d, _ = parse_h2d((FIX / "h2d-8xh100-handwritten.out").read_text())
    figs = {f.name.split(" ")[0]: f for f in gpu_figures(verdicts, h2d, smi("8xh100-565.57.01"))}
    assert figs["connector_read_gb_s"].value == 5.0 and figs["connector_efficiency"].value == 0.8333
    assert figs["per_gpu_read_gb_s"].value == 6.1
    assert figs["h2d_of_pcie_ceiling"].value == pytest.approx(((1 << 30) / 0.0208 / 1e9) / 63.0154, rel=1e-3)
    assert figs["ttft_readback_p50_s"].value is None and figs["ttft_readback_p50_s"].source == "G2 ERROR"
    text = figures_text(list(figs.values()))
    assert "not measured" in text and "PCIe gen 5 x16" in text
    assert gate_notes(verdicts) == ["G2 ERROR: vLLM did not start"]


def test_a_gate_that_ended_in_error_measured_nothing_whatever_its_metrics_hold():
    verdicts = {"verdicts": [{"gate_id": "G1C-gpu", "outcome": "ERROR", "reason": "readers did not all start",
                              "metrics": {"fio_read_gb_s": 0.0, "connector_read_gb_s": 0.0}},
                             {"gate_id": "G1", "outcome": "FAIL", "reason": "below", "metrics": {"per_gpu_read_gb_s": 0.2}}]}
    figs = {f.name.split(" ")[0]: f for f in gpu_figures(verdicts, (), None)}
    assert figs["fio_read_gb_s"].value is None and figs["connector_read_gb_s"].value is None
    assert figs["per_gpu_read_gb_s"].value == 0.2 and figs["per_gpu_read_gb_s"].source == "G1 FAIL"  # measured
    assert figs["h2d_gb_s"].value is None and figs["h2d_of_pcie_ceiling"].value is None


def test_the_script_sends_the_probes_parsed_here():
    script = (ROOT / "scripts" / "gpu-check.sh").read_text()
    for pr in (NVIDIA_SMI_Q, PCI_NUMA):
        line = next(l for l in script.splitlines() if l.startswith(f"step {pr.step} "))
        argv = shlex.split(line.split(" ", 3)[3].removesuffix(" || true"))
        assert tuple(argv) == pr.argv
