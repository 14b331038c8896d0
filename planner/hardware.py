"""The system: one GPU type, how many, how they are wired. Units converted once, on load."""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner.bounds import check
from planner.calibration import Calibration
from planner.errors import InputError

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")


@dataclass(frozen=True)
class GPU:
    """One accelerator type, as in data/gpus.json (every value names its datasheet there)."""

    name: str
    """Catalog name, lower case (e.g. 'h100-sxm')."""
    memory_bytes: int
    """Device memory the framework can allocate from."""
    peak_flops_per_s: dict
    """Dense peak FLOP/s per dtype: fp32, tf32, bf16, fp16, fp8 (0 where unsupported)."""
    hbm_bytes_per_s: float
    """Device memory bandwidth."""
    intra_node_bytes_per_s: float
    """GPU-GPU link bandwidth inside a node, per GPU and direction (NVLink, or PCIe without it)."""
    inter_node_bytes_per_s: float
    """Network bandwidth per GPU and direction between nodes."""
    pcie_bytes_per_s: float
    """Host link bandwidth per GPU and direction (offload traffic)."""
    gpus_per_node: int
    """Usual GPUs in one node of this type."""
    host_ram_bytes_per_node: int
    """CPU memory of one node (ZeRO-Offload capacity)."""
    nvme_bytes_per_s_per_node: float
    """Aggregate NVMe bandwidth per node (ZeRO-Infinity)."""
    attention_efficiency: float = 0.0
    """Fraction of the 16-bit peak FlashAttention reaches on this GPU (0: the global prior)."""
    gemm_efficiency_max: float = 0.0
    """Fraction of the 16-bit peak the largest GEMMs reach on this GPU in isolation, where it was
    measured and no published run checks the global prior on it (0: the prior, gemm_efficiency_max
    in data/coefficients.json)."""
    sm_count: int = 0
    """Streaming multiprocessors (AMD: compute units): communication kernels that run beside a
    GEMM take some of them (0: unknown, none taken)."""
    compute_capability: float = 0.0
    """CUDA compute capability major.minor (0: not a CUDA device): 9.0 on brings CUDA multicast."""
    source: str = ""
    """Datasheets and assumptions behind the numbers."""
    gpus_per_host: int = 0
    """GPUs under one operating-system host of this type's node: its CPUs, host RAM and NVMe, and one
    launcher (torchrun --nproc-per-node). 0: the whole node (an 8-GPU server). A GB200/GB300 NVL72
    node (the 72-GPU NVLink domain) is 18 compute trays of 4 GPUs each (host_ram_bytes_per_node and
    nvme_bytes_per_s_per_node are the node's total, spread evenly over its hosts)."""

    def __post_init__(self):
        for key in ("memory_bytes", "hbm_bytes_per_s", "intra_node_bytes_per_s", "inter_node_bytes_per_s",
                    "pcie_bytes_per_s", "gpus_per_node", "host_ram_bytes_per_node", "nvme_bytes_per_s_per_node"):
            if not getattr(self, key) > 0:
                raise InputError(f"--{key.replace('_', '-')}: must be positive, got {getattr(self, key)!r}")
        if self.gpus_per_host < 0 or (self.gpus_per_host and self.gpus_per_node % self.gpus_per_host):
            raise InputError(f"{self.name}: gpus_per_host {self.gpus_per_host!r} must divide gpus_per_node "
                             f"{self.gpus_per_node} (0: one host per node)")

    @property
    def host_gpus(self) -> int:
        """GPUs of one host (gpus_per_host, or the whole node)."""
        return self.gpus_per_host or self.gpus_per_node


@dataclass(frozen=True)
class Cluster:
    """How many GPUs of one type, and how many share a node (NVLink domain)."""

    gpu: GPU
    """The accelerator."""
    num_gpus: int
    """Total GPUs in the job."""
    gpus_per_node: int
    """GPUs per node; TP groups stay inside a node."""
    calibration: Calibration | None = None
    """A measured profile whose fitted coefficients replace the priors (None: the priors)."""
    pod_gpus: int = 0
    """GPUs under one non-blocking switch domain (a pod: full bisection bandwidth inside it); 0: the
    whole network is non-blocking (NVIDIA DGX SuperPOD reference architecture: a full fat tree)."""
    oversubscription: float = 1.0
    """Ratio of a pod's NIC bandwidth to its uplink bandwidth above the pod (Llama 3's RoCE cluster:
    pods of 3072 GPUs, 1:7 above them; Dubey et al. 2024 section 3.3.1). 1: non-blocking."""

    def __post_init__(self):
        check("gpus", self.num_gpus)
        check("gpus_per_node", self.gpus_per_node)
        if self.num_gpus > self.gpus_per_node and self.num_gpus % self.gpus_per_node:
            raise InputError(
                f"--gpus: {self.num_gpus} is not a whole number of nodes of --gpus-per-node {self.gpus_per_node}"
            )
        check("pod_gpus", self.pod_gpus)
        check("oversubscription", self.oversubscription)
        if self.pod_gpus % self.gpus_per_node:
            raise InputError(f"--pod-gpus: {self.pod_gpus} is not a whole number of nodes of --gpus-per-node "
                             f"{self.gpus_per_node} (0: no pod boundary)")
        if self.oversubscription > 1 and not self.pod_gpus:
            raise InputError("--oversubscription: needs --pod-gpus (the GPUs below the oversubscribed switches)")

    @property
    def num_nodes(self) -> int:
        return max(1, self.num_gpus // self.gpus_per_node)

    @property
    def gpus_per_host(self) -> int:
        """The job's GPUs on one host (one launcher's processes, sharing its CPUs, RAM and NVMe): the
        node's on an 8-GPU server, a 4-GPU compute tray's on an NVL72 rack, fewer for a smaller job."""
        return max(1, min(self.gpu.gpus_per_host or self.gpus_per_node, self.gpus_per_node, self.num_gpus))

    @property
    def num_hosts(self) -> int:
        """Hosts the job runs on (launcher nodes: torchrun --nnodes)."""
        return max(1, -(-self.num_gpus // self.gpus_per_host))

    @property
    def host_ram_bytes_per_host(self) -> int:
        """CPU memory of one whole host: the node's, or its share of an NVL72 rack's (a job's ranks on
        a host share all of it, whether or not the job fills the host)."""
        return int(self.gpu.host_ram_bytes_per_node * self.gpu.host_gpus / self.gpu.gpus_per_node)

    @property
    def nvme_bytes_per_s_per_host(self) -> float:
        """Aggregate NVMe bandwidth of one whole host (as host_ram_bytes_per_host)."""
        return self.gpu.nvme_bytes_per_s_per_node * self.gpu.host_gpus / self.gpu.gpus_per_node


def nvlink_domain(gpu: GPU, num_gpus: int) -> int:
    """The job's GPUs under one NVLink domain on a rack-scale GPU (gpus_per_host set: GB200/GB300
    NVL72), the node of the topology: the whole job where it fits in one rack, else the largest
    whole number of compute trays per rack that splits the job evenly (a scheduler's block
    topology, e.g. Slurm topology/block, hands a job equal segments of its racks: 128 GPUs are two
    racks of 64, 144 two of 72). A count of GPUs per host given as --gpus-per-node (4: a compute
    tray, the scheduler's node) is read this way too, since the tray is not the NVLink domain."""
    if num_gpus <= gpu.gpus_per_node:
        return num_gpus
    trays = [d for d in range(gpu.gpus_per_host, gpu.gpus_per_node + 1, gpu.gpus_per_host) if num_gpus % d == 0]
    return max(trays, default=gpu.gpus_per_node)


def load_gpus() -> dict[str, GPU]:
    """GPU catalog from data/gpus.json, keyed by name and every alias (lower case)."""
    from planner.data import catalog as read_catalog

    catalog = {}
    for e in read_catalog("gpus.json")["gpus"]:
        gpu = GPU(
            name=e["name"],
            memory_bytes=int(e["memory_mib"] * 2**20),
            peak_flops_per_s={k: float(v) * 1e12 for k, v in e["tflops_per_s"].items()},
            hbm_bytes_per_s=e["hbm_gb_per_s"] * 1e9,
            intra_node_bytes_per_s=e["intra_node_gb_per_s"] * 1e9,
            inter_node_bytes_per_s=e["inter_node_gb_per_s"] * 1e9,
            pcie_bytes_per_s=e["pcie_gb_per_s"] * 1e9,
            gpus_per_node=int(e["gpus_per_node"]),
            host_ram_bytes_per_node=int(e["host_ram_gib_per_node"] * 2**30),
            nvme_bytes_per_s_per_node=e["nvme_gb_per_s_per_node"] * 1e9,
            attention_efficiency=float(e.get("attention_efficiency", 0.0)),
            gemm_efficiency_max=float(e.get("gemm_efficiency_max", 0.0)),
            sm_count=int(e.get("sm_count", 0)),
            compute_capability=float(e.get("compute_capability", 0.0)),
            source=e["source"],
            gpus_per_host=int(e.get("gpus_per_host", 0)),
        )
        for key in [e["name"], *e.get("aliases", [])]:
            catalog[key.lower()] = gpu
    return catalog


def lookup_gpu(name: str) -> GPU:
    """Catalog GPU by case-insensitive name or alias."""
    import difflib

    catalog = load_gpus()
    key = str(name).lower().replace("_", "-")
    if key in catalog:
        return catalog[key]
    names = sorted({g.name for g in catalog.values()})
    # aliases of one GPU (h100, h100-sxm) both match: name each GPU once, in match order
    close = list(dict.fromkeys(catalog[c].name for c in difflib.get_close_matches(key, list(catalog), n=4, cutoff=0.5)))[:2]
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise InputError(f"--gpu: unknown GPU {name!r}{hint}; known: {', '.join(names)}")


def with_overrides(gpu: GPU, **overrides) -> GPU:
    """GPU with CLI overrides applied (None values ignored); validated again."""
    clean = {k: v for k, v in overrides.items() if v is not None}
    return replace(gpu, **clean) if clean else gpu
