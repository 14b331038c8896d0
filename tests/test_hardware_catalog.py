"""data/gpus.json's GB200 NVL72, GB300 NVL72 and 96 GB H100 entries against their datasheets (the
arithmetic beside each assert), their names through the path the CLI takes, and a 72-GPU NVLink
domain as the node: a rack, two racks, and a job on part of one."""

import io
import json
import math

import pytest

from planner import cli
from planner import hardware as H
from planner.calibration import coefficient_values
from planner.collectives import group_bus_bytes_per_s, ranks_per_node
from planner.data import catalog
from planner.errors import InputError
from planner.inputs import ClusterInput

GiB, TB = 2**30, 1e12
NEW = ("gb200", "gb300", "h100-96gb")


def run_json(*argv):
    out = io.StringIO()
    assert cli.main([*argv, "--json"], out=out) == 0
    return json.loads(out.getvalue())


def entry(name):
    return next(e for e in catalog("gpus.json")["gpus"] if e["name"] == name)


# --- the datasheet numbers -------------------------------------------------------------------

@pytest.mark.parametrize("name", ["gb200", "gb300"])
def test_nvl72_peaks_are_the_rack_figures_per_gpu_dense(name):
    g = H.lookup_gpu(name)
    # GB200 / GB300 NVL72 datasheets, rack figures with sparsity, per GPU, halved for dense:
    assert g.peak_flops_per_s["bf16"] == pytest.approx(360e15 / 72 / 2, rel=1e-9)  # FP16/BF16 360 PFLOPS -> 2.5 PFLOP/s
    assert g.peak_flops_per_s["fp16"] == g.peak_flops_per_s["bf16"]
    assert g.peak_flops_per_s["fp8"] == pytest.approx(720e15 / 72 / 2, rel=1e-9)  # FP8/FP6 720 PFLOPS -> 5.0 PFLOP/s
    assert g.peak_flops_per_s["tf32"] == pytest.approx(180e15 / 72 / 2, rel=1e-9)  # TF32 180 PFLOPS -> 1.25 PFLOP/s
    # FP32 (approximate in the catalog): GB200 datasheet 5,760 TFLOPS / 72 = 80 (an older revision: 6,480 / 72 = 90)
    assert 75e12 <= g.peak_flops_per_s["fp32"] <= 90e12
    assert g.hbm_bytes_per_s == pytest.approx(576 * TB / 72, rel=1e-9)  # HBM3e 576 TB/s per rack -> 8 TB/s
    assert g.intra_node_bytes_per_s == pytest.approx(1.8 * TB / 2, rel=1e-9)  # NVLink 5 1.8 TB/s per GPU both ways
    assert g.gpus_per_node == 72  # the rack's NVLink domain is the node
    assert g.gpus_per_host == 4  # 18 compute trays of 2 superchips (4 GPUs) per rack
    # NVLink-C2C 900 GB/s bidirectional per superchip, 2 GPUs: 900 / 2 directions / 2 GPUs = 225 GB/s
    assert g.pcie_bytes_per_s == pytest.approx(900e9 / 2 / 2, rel=1e-9)
    # Grace LPDDR5X up to 480 GB per superchip (taken as GiB), 36 superchips per rack (datasheet: up to 17 TB)
    assert g.host_ram_bytes_per_node == 36 * 480 * GiB
    assert g.compute_capability >= 10.0
    # no published FlashAttention figure on Grace Blackwell: B200's assumption (as on Hopper)
    assert g.attention_efficiency == H.lookup_gpu("b200").attention_efficiency == 0.35


def test_gb200_memory_nics_and_sms():
    g = H.lookup_gpu("gb200")
    # GB200 NVL72 datasheet: up to 13.4 TB HBM3e / 72 = 186 GB a GPU; usable 189471 MiB = 185.0 GiB
    assert g.memory_bytes == 189471 * 2**20
    assert g.memory_bytes / GiB == pytest.approx(13.4e12 / 72 / 1e9, rel=0.01)
    # DGX GB200: one ConnectX-7 400 Gb/s per GPU = 400e9 / 8 = 50 GB/s per direction
    assert g.inter_node_bytes_per_s == pytest.approx(400e9 / 8, rel=1e-9)
    assert g.sm_count == 148 and g.compute_capability == 10.0  # B200's dies; sm_100


def test_gb300_memory_nics_and_sms():
    g = H.lookup_gpu("gb300")
    # GB300 NVL72 datasheet: 288 GB HBM3e a GPU, taken as 288e9 bytes (268.2 GiB usable)
    assert g.memory_bytes == pytest.approx(288e9, rel=1e-3)
    # DGX GB300: one ConnectX-8 800 Gb/s per GPU = 800e9 / 8 = 100 GB/s per direction
    assert g.inter_node_bytes_per_s == pytest.approx(800e9 / 8, rel=1e-9)
    assert 148 <= g.sm_count <= 160  # 160 on the full Blackwell Ultra die; shipping SKUs 148 and 152
    assert g.compute_capability == 10.3  # sm_103
    # Blackwell Ultra raised FP4, not BF16/FP8: the same dense peaks as GB200, more memory
    assert g.peak_flops_per_s == H.lookup_gpu("gb200").peak_flops_per_s
    assert g.memory_bytes > 1.4 * H.lookup_gpu("gb200").memory_bytes


def test_h100_96gb_is_h100_sxm_with_more_slower_memory():
    g, sxm = H.lookup_gpu("h100-96gb"), H.lookup_gpu("h100-sxm")
    # torchtitan's Grand Teton runs: 96GB HBM2e at 2.4 TB/s; torch reports 95.00 GiB (48.87 GiB = 51.44%)
    assert g.memory_bytes == 95 * GiB
    assert g.memory_bytes / GiB == pytest.approx(48.87 / 0.5144, rel=1e-3)
    assert g.hbm_bytes_per_s == pytest.approx(2.4 * TB, rel=1e-9)
    # H100 SXM5 datasheet peaks at 700 W, not derated for the 500 W cap (no power model): 989.4 dense BF16
    assert g.peak_flops_per_s == sxm.peak_flops_per_s
    assert g.peak_flops_per_s["bf16"] == pytest.approx(1978.9e12 / 2, rel=1e-3)  # 1,979 TFLOPS sparse / 2
    # 400 Gb/s RDMA per GPU = 50 GB/s; NVLink4 900 GB/s total = 450 per direction; 8 GPUs a host
    assert g.inter_node_bytes_per_s == pytest.approx(400e9 / 8, rel=1e-9)
    assert g.intra_node_bytes_per_s == pytest.approx(900e9 / 2, rel=1e-9)
    assert (g.gpus_per_node, g.host_gpus, g.sm_count, g.compute_capability) == (8, 8, 132, 9.0)
    assert (g.pcie_bytes_per_s, g.host_ram_bytes_per_node) == (sxm.pcie_bytes_per_s, sxm.host_ram_bytes_per_node)
    assert g.attention_efficiency == sxm.attention_efficiency  # FlashAttention-2 at 35% on Hopper


@pytest.mark.parametrize("name", NEW)
def test_every_number_names_its_source(name):
    e = entry(name)
    for key in ("source", "memory_source", "tflops_per_s_source", "attention_efficiency_source", "sm_count_source",
                "compute_capability_source"):
        assert len(e[key]) > 20, key
    assert "datasheet" in e["tflops_per_s_source"] or "as h100-sxm" in e["tflops_per_s_source"]
    assert e["memory_source"].startswith("approximate:")  # no usable total measured here on any of the three
    assert e["sm_count_source"].startswith("approximate:")


def test_every_catalog_entry_loads_with_a_source():
    gpus = catalog("gpus.json")["gpus"]
    assert len({e["name"] for e in gpus}) == len(gpus)
    for e in gpus:
        g = H.lookup_gpu(e["name"])
        assert g.source and g.gpus_per_node % g.host_gpus == 0
        assert all(math.isfinite(v) and v >= 0 for v in g.peak_flops_per_s.values())


# --- the largest GEMMs' share of the peak ------------------------------------------------------

# Bekman, Machine Learning Engineering (stas00/ml-engineering 744d01e) compute/accelerator/README.md,
# 'Maximum Achievable Matmul FLOPS comparison table', BF16: TFLOP/s at each GPU's best shape (M, N, K)
MAMF_BF16 = {"mi300x": (668.4, (10240, 15360, 8192)), "b200": (1745.0, (1792, 16128, 3072)),
             "gb200": (1822.0, (4096, 9728, 2048))}


@pytest.mark.parametrize("name", sorted(MAMF_BF16))
def test_the_largest_gemm_runs_at_the_measured_ceiling(name):
    from planner import compute, hardware

    tflops, (m, n, k) = MAMF_BF16[name]
    cluster = hardware.Cluster(H.lookup_gpu(name), 8, 8)
    c = compute.gpu_time_coefficients(cluster, coefficient_values("time"))
    flops = 2.0 * m * n * k  # one GEMM at the table's best shape
    rate = flops / compute.gemm_s(flops, cluster.gpu.peak_flops_per_s["bf16"], c)
    assert rate == pytest.approx(tflops * 1e12, rel=0.02)  # MI300X: 668 of its 1307 TFLOP/s peak
    from planner import timing

    assert timing.time_coefficients(cluster)["gemm_efficiency_max"] == c["gemm_efficiency_max"]  # the step's


def test_a_gpu_without_a_measured_ceiling_keeps_the_prior_and_a_profile_beats_the_catalog():
    from planner import compute, hardware
    from planner.calibration import Calibration

    prior = coefficient_values("time")
    h100 = hardware.Cluster(H.lookup_gpu("h100-sxm"), 8, 8)
    assert compute.gpu_time_coefficients(h100, prior)["gemm_efficiency_max"] == prior["gemm_efficiency_max"]
    # a profile fitted on the GPU itself (calibrate's GEMM bench) comes before the catalog's figure
    fitted = Calibration("mi300x-bench", "-", "mi300x", overrides=(("time", "gemm_efficiency_max", 0.6),))
    mi300x = hardware.Cluster(H.lookup_gpu("mi300x"), 8, 8, calibration=fitted)
    assert compute.gpu_time_coefficients(mi300x, coefficient_values("time", fitted))["gemm_efficiency_max"] == 0.6


# --- names, as the CLI resolves them -------------------------------------------------------------

@pytest.mark.parametrize("typed, name", [
    ("gb200", "gb200"), ("GB200", "gb200"), ("gb200-nvl72", "gb200"), ("GB200_NVL72", "gb200"),
    ("gb300", "gb300"), ("gb300-nvl72", "gb300"), ("gb300-288gb", "gb300"),
    ("h100-96gb", "h100-96gb"), ("h100-96", "h100-96gb"), ("h100-sxm-96gb", "h100-96gb"), ("H100_96GB", "h100-96gb"),
    ("h100-96gb-hbm2e", "h100-96gb"),
])
def test_names_and_aliases_resolve(typed, name):
    assert H.lookup_gpu(typed).name == name
    assert ClusterInput(gpu=typed, gpus=8).resolve("bf16").gpu.name == name


def test_the_80gb_h100_keeps_its_names():
    for typed in ("h100", "h100-sxm", "h100-80gb-hbm3"):
        assert H.lookup_gpu(typed).name == "h100-sxm"


def test_unknown_names_list_the_new_gpus():
    with pytest.raises(InputError, match="gb200.*gb300.*h100-96gb"):
        H.lookup_gpu("tpu-v5")


# --- a 72-GPU node ------------------------------------------------------------------------------

def test_a_rack_is_one_node_and_two_racks_two():
    one = ClusterInput(gpu="gb200", gpus=72).resolve("bf16")
    two = ClusterInput(gpu="gb200", gpus=144).resolve("bf16")
    assert (one.gpus_per_node, one.num_nodes, one.gpus_per_host, one.num_hosts) == (72, 1, 4, 18)
    assert (two.gpus_per_node, two.num_nodes, two.num_hosts) == (72, 2, 36)
    c = coefficient_values("time")
    # 72 ranks in a row stay on NVLink on a rack; on 8-GPU B200 servers they cross 9 nodes' NICs
    nvlink = H.lookup_gpu("gb200").intra_node_bytes_per_s * c["bus_efficiency_intra_node"]
    assert group_bus_bytes_per_s(one, 1, 72, c) == pytest.approx(nvlink)
    assert ranks_per_node(one, 1, 72) == 72
    b200 = ClusterInput(gpu="b200", gpus=72).resolve("bf16")
    assert group_bus_bytes_per_s(b200, 1, 72, c) < nvlink
    # data parallel across the two racks: tp 8 leaves 9 ranks of a group on each rack's NICs
    assert ranks_per_node(two, 8, 18) == 9
    assert group_bus_bytes_per_s(two, 8, 18, c) == pytest.approx(
        min(nvlink, 9 * 50e9 * c["bus_efficiency_inter_node"]))


def test_a_job_on_part_of_a_rack_is_accepted():
    c = ClusterInput(gpu="gb200", gpus=16).resolve("bf16")
    assert (c.num_gpus, c.gpus_per_node, c.num_nodes) == (16, 16, 1)
    assert (c.gpus_per_host, c.num_hosts) == (4, 4)
    H.Cluster(H.lookup_gpu("gb200"), 16, 72)  # explicit rack size, fewer GPUs: accepted
    # a host's share of the rack's Grace memory: 2 superchips x 480 GiB
    assert c.host_ram_bytes_per_host == 2 * 480 * GiB
    assert c.nvme_bytes_per_s_per_host == pytest.approx(450e9 / 18)


def test_an_8_gpu_server_is_one_host():
    c = ClusterInput(gpu="h100-96gb", gpus=16).resolve("bf16")
    assert (c.gpus_per_node, c.gpus_per_host, c.num_hosts) == (8, 8, 2)
    assert c.host_ram_bytes_per_host == c.gpu.host_ram_bytes_per_node
    small = ClusterInput(gpu="h100", gpus=4).resolve("bf16")
    assert (small.gpus_per_host, small.num_hosts, small.host_ram_bytes_per_host) == (4, 1, 2048 * GiB)


def test_a_job_over_racks_takes_equal_segments_of_whole_trays():
    # 128 GPUs = 32 compute trays of 4: two racks of 16 trays (64 GPUs on NVLink each), not 72 + 56
    c = ClusterInput(gpu="gb200", gpus=128).resolve("bf16")
    assert (c.gpus_per_node, c.num_nodes, c.gpus_per_host, c.num_hosts) == (64, 2, 4, 32)
    assert ClusterInput(gpu="gb300", gpus=576).resolve("bf16").gpus_per_node == 72  # 8 whole racks
    # a scheduler's node on NVL72 is the 4-GPU tray: --gpus-per-node 4 keeps the rack's NVLink domain
    said = ClusterInput(gpu="gb200", gpus=128, gpus_per_node=4).resolve("bf16")
    assert (said.gpus_per_node, said.gpus_per_host) == (64, 4)
    d = run_json("estimate", "--params", "70e9", "--gpu", "gb200", "--gpus", "128", "--gpus-per-node", "4",
                 "--tp", "8", "--pp", "2")
    assert d["cluster"]["gpus_per_node"] == 64  # TP 8 inside the NVLink domain, not refused
    # trays hold 4 GPUs: 98 cannot be placed
    with pytest.raises(InputError, match="--gpus: 98 is not a whole number of nodes"):
        ClusterInput(gpu="gb200", gpus=98).resolve("bf16")


def test_gpus_per_host_must_divide_the_node():
    g = H.lookup_gpu("gb200")
    with pytest.raises(InputError, match="gpus_per_host"):
        H.with_overrides(g, gpus_per_host=5)


# --- an estimate on each -------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ("estimate", "--params", "70e9", "--gpu", "gb200", "--gpus", "72", "--tp", "8"),
    ("estimate", "--model", "llama-3-8b", "--gpu", "gb200", "--gpus", "16"),
    ("estimate", "--model", "llama-3-70b", "--gpu", "gb200", "--gpus", "144", "--tp", "8", "--pp", "2"),
    ("estimate", "--params", "70e9", "--gpu", "gb300", "--gpus", "72", "--pp", "9"),
    ("estimate", "--model", "llama-3-8b", "--gpu", "h100-96gb", "--gpus", "8", "--zero", "3"),
])
def test_estimate_is_finite_and_positive(argv):
    d = run_json(*argv)
    gpu = H.lookup_gpu(argv[argv.index("--gpu") + 1])
    assert d["cluster"]["memory_bytes"] == gpu.memory_bytes == d["memory"]["capacity_bytes"]
    assert d["cluster"]["gpus_per_node"] == min(gpu.gpus_per_node, int(argv[argv.index("--gpus") + 1]))
    for value in (d["time"]["step_s"], d["throughput"]["tokens_per_s"], d["throughput"]["mfu"],
                  d["memory"]["gpu_bytes"]):
        assert math.isfinite(value) and value > 0
    assert d["throughput"]["mfu"] < 1
    assert all(math.isfinite(v) and v >= 0 for v in d["time"]["breakdown"].values())


@pytest.mark.parametrize("argv", [
    ("recommend", "--params", "405e9", "--gpu", "gb200", "--gpus", "144", "--top", "3"),
    ("recommend", "--params", "70e9", "--gpu", "gb300", "--gpus", "72", "--top", "3"),
])
def test_recommend_on_racks_answers_with_tp_inside_the_rack(argv):
    d = run_json(*argv)
    assert d["assumptions"]["gpus_per_node"] == 72 and d["layouts"]
    for row in d["layouts"]:
        assert 72 % row["layout"]["tp"] == 0 and row["memory"]["fits"]
        assert math.isfinite(row["time"]["step_s"]) and row["time"]["step_s"] > 0


def test_docs_table_is_the_catalog():
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "hardware.md").read_text()
    tables = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| `")]
    rows = {cells[0].strip("` "): cells[1:9] for cells in tables if len(cells) >= 9}
    ceilings = {cells[0].strip("` "): float(cells[2]) for cells in tables if len(cells) == 3}
    gpus = catalog("gpus.json")["gpus"]
    assert set(rows) == {e["name"] for e in gpus}
    assert ceilings == {e["name"]: e["gemm_efficiency_max"] for e in gpus if "gemm_efficiency_max" in e}
    for e in gpus:
        mem, bf16, fp8, hbm, link, nic, host, node = rows[e["name"]]
        num = lambda s: float(s.replace(",", ""))  # noqa: E731
        assert num(mem) == pytest.approx(e["memory_mib"] / 1024, abs=0.05)
        assert num(bf16) == pytest.approx(e["tflops_per_s"]["bf16"], abs=0.5)
        fp8_peak = e["tflops_per_s"]["fp8"]
        assert fp8 == "-" if not fp8_peak else num(fp8) == pytest.approx(fp8_peak, abs=0.5)
        assert num(hbm) == pytest.approx(e["hbm_gb_per_s"] / 1000)
        links = (e["intra_node_gb_per_s"], e["inter_node_gb_per_s"], e["pcie_gb_per_s"])
        assert (num(link), num(nic), num(host)) == links
        assert int(node.split()[0]) == e["gpus_per_node"]


# --- a host is what launches, steps CPU Adam and holds offloaded states ----------------------------

def test_launch_files_start_one_launcher_per_compute_tray(tmp_path):
    # GB200 NVL72: 18 compute trays of 4 GPUs per rack (datasheet), each its own host: deepspeed's
    # --num_gpus and Accelerate's num_machines count a host's GPUs and the hosts, not the rack
    d = run_json("estimate", "--params", "70e9", "--gpu", "gb200", "--gpus", "72", "--zero", "3",
                 "--emit", str(tmp_path))
    assert d["cluster"]["num_gpus"] == 72
    launch = (tmp_path / "launch.sh").read_text()
    assert "--num_gpus 4 --num_nodes 18" in launch  # 72 / 4 = 18 hosts
    assert "num_machines: 18" in (tmp_path / "accelerate_config.yaml").read_text()


def test_offloaded_states_are_held_by_the_trays_ram():
    # ZeRO-3 with optimizer offload keeps 12 B/param fp32 master and moments of each rank's
    # partition on the host (DeepSpeed 0.19.8 stage3.py): a 4-GPU tray's ranks hold 4 of the 72
    # partitions, 70e9 * 12 B * 4/72 = 46.7 GB, far under its 960 GiB; the rack-wide figure would be
    # 840 GB, which the old per-node count compared against the rack's 17,280 GiB
    d = run_json("estimate", "--params", "70e9", "--gpu", "gb200", "--gpus", "72", "--zero", "3",
                 "--offload-optimizer", "cpu")
    host = d["memory"]["cpu_bytes_per_node"]
    assert 70e9 * 12 * 4 / 72 <= host < 2 * 70e9 * 12 * 4 / 72
