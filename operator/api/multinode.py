"""Pure: what an instance spanning several whole GPU nodes needs from each engine.

An instance of ``<role>.nodesPerInstance`` = n > 1 nodes is one LeaderWorkerSet group of n
pods (``lws.py``); LWS's pod webhook puts ``LWS_LEADER_ADDRESS``, ``LWS_GROUP_SIZE`` and
``LWS_WORKER_INDEX`` (leader 0) into every container (LWS v0.7.0
``pkg/utils/pod/pod_utils.go``), and the engines take their multi-node arguments from them:

- SGLang (``server_args.py``): the same command on every node plus ``--nnodes n --node-rank
  $(LWS_WORKER_INDEX) --dist-init-addr $(LWS_LEADER_ADDRESS):PORT``. Only node rank 0 runs the
  tokenizer, the HTTP API and (on prefill) the bootstrap server; ranks >= 1 run schedulers and
  a dummy server with ``/health`` only on ``--port`` (SGLang ``entrypoints/engine.py``).
- vLLM (``vllm/config/parallel.py``, ``entrypoints/cli/serve.py``, docs/serving/
  data_parallel_deployment.md): multi-node data parallelism with its internal load balancer.
  Every node runs ``--data-parallel-size DP --data-parallel-size-local DP/n
  --data-parallel-address $(LWS_LEADER_ADDRESS) --data-parallel-rpc-port PORT``; the head
  (leader) runs the only API server, the others add ``--headless --data-parallel-start-rank
  LWS_WORKER_INDEX x DP/n``. A TP group stays inside one node; pipeline parallelism across
  nodes (Ray) is not rendered.

Kubernetes expands ``$(VAR)`` in args from the container's environment; it cannot multiply,
so the vLLM workers' start rank is computed by ``/bin/sh`` (as llm-d's wide-EP guide does).
"""

from __future__ import annotations

from .pdcluster import EngineKind, PDClusterSpec, RoleParallelism

#: the env LWS gives every container of a group
LWS_LEADER_ADDRESS = "LWS_LEADER_ADDRESS"
LWS_GROUP_SIZE = "LWS_GROUP_SIZE"
LWS_WORKER_INDEX = "LWS_WORKER_INDEX"

#: SGLang's torch.distributed rendezvous port on the leader (SGLang's own LWS PD example uses
#: 20102; any free port works, every node must name the same)
SGLANG_DIST_INIT_PORT = 20102
#: vLLM's --data-parallel-rpc-port default (vllm/config/parallel.py), named explicitly so the
#: head and the headless nodes cannot disagree
VLLM_DP_RPC_PORT = 29550

ROLES = ("prefill", "decode")


def nodes_per_instance(spec: PDClusterSpec, role: str) -> int:
    """Whole nodes one instance of ``role`` spans (1 for a spec without the field)."""
    return int(getattr(getattr(spec, role), "nodes_per_instance", 1))


def is_group(spec: PDClusterSpec, role: str) -> bool:
    """True when ``role`` renders as a LeaderWorkerSet (instances of more than one node)."""
    return nodes_per_instance(spec, role) > 1


def gpus_used(engine: EngineKind, p: RoleParallelism) -> tuple[int, str]:
    """GPUs one instance's layout occupies, and how that number comes about."""
    if engine is EngineKind.SGLANG and p.data_parallel_attention:
        # DP-attention splits the TP group's GPUs into DP attention groups: no extra GPUs.
        gpus, how = p.tensor_parallel_size, f"tensorParallelSize {p.tensor_parallel_size} with DP-attention"
    else:
        gpus = p.tensor_parallel_size * p.data_parallel_size
        how = f"tensorParallelSize {p.tensor_parallel_size} x dataParallelSize {p.data_parallel_size}"
    if p.pipeline_parallel_size > 1:
        gpus *= p.pipeline_parallel_size
        how += f" x pipelineParallelSize {p.pipeline_parallel_size}"
    return gpus, how


def problems(spec: PDClusterSpec) -> list[tuple[str, str]]:
    """(field, why) for layouts an instance of several nodes cannot run, and for the group
    settings given to a one-node role. The GPU count itself (layout = nodes x gpusPerNode) is
    checked with the rest of the topology in ``checklist``."""
    out: list[tuple[str, str]] = []
    for role in ROLES:
        n = nodes_per_instance(spec, role)
        r = getattr(spec, role)
        p: RoleParallelism = getattr(spec.parallelism, role)
        base = f"spec.parallelism.{role}"
        if n == 1:
            if r.exclusive_topology_key is not None:
                out.append((f"spec.{role}.exclusiveTopologyKey",
                            "applies to instances of several nodes only (nodesPerInstance > 1)"))
            continue
        per_node = spec.placement.gpus_per_node
        if spec.engine.kind is EngineKind.SGLANG:
            if p.data_parallel_size > 1 and not p.data_parallel_attention:
                out.append((f"{base}.dataParallelSize",
                            f"SGLang across {n} nodes (nodesPerInstance) runs one TP group over "
                            f"them; dataParallelSize {p.data_parallel_size} needs "
                            f"dataParallelAttention, or nodesPerInstance 1"))
        else:
            if p.pipeline_parallel_size > 1:
                out.append((f"{base}.pipelineParallelSize",
                            f"VLLM across {n} nodes is rendered as multi-node data parallelism "
                            f"(head and --headless nodes); pipeline parallelism across nodes "
                            f"needs Ray, which pdscale does not deploy: use 1"))
            if p.tensor_parallel_size > per_node or per_node % p.tensor_parallel_size:
                out.append((f"{base}.tensorParallelSize",
                            f"VLLM's multi-node data parallelism keeps each TP group inside one "
                            f"node: {p.tensor_parallel_size} must divide placement.gpusPerNode "
                            f"{per_node}"))
            # (with TP dividing a node and TP x DP = nodes x gpusPerNode, DP splits evenly
            # over the nodes: each runs dataParallelSize / nodesPerInstance ranks)
    return out


def sglang_args(spec: PDClusterSpec, role: str) -> list[str]:
    """SGLang's pipeline and multi-node arguments ([] for a one-node instance without PP):
    identical on every node of a group, the rank read from LWS's environment."""
    par: RoleParallelism = getattr(spec.parallelism, role)
    out: list[str] = []
    if par.pipeline_parallel_size > 1:
        out += ["--pp-size", str(par.pipeline_parallel_size)]
    n = nodes_per_instance(spec, role)
    if n > 1:
        out += [
            "--nnodes", str(n),
            "--node-rank", f"$({LWS_WORKER_INDEX})",
            "--dist-init-addr", f"$({LWS_LEADER_ADDRESS}):{SGLANG_DIST_INIT_PORT}",
        ]
    return out


def vllm_args(spec: PDClusterSpec, role: str) -> list[str]:
    """vLLM's pipeline (one node) and multi-node data-parallel arguments common to the head
    and the headless nodes ([] for a one-node instance without PP)."""
    par: RoleParallelism = getattr(spec.parallelism, role)
    n = nodes_per_instance(spec, role)
    if n == 1:
        if par.pipeline_parallel_size > 1:
            return ["--pipeline-parallel-size", str(par.pipeline_parallel_size)]
        return []
    return [
        "--data-parallel-size-local", str(par.data_parallel_size // n),
        "--data-parallel-address", f"$({LWS_LEADER_ADDRESS})",
        "--data-parallel-rpc-port", str(VLLM_DP_RPC_PORT),
    ]


def vllm_headless_command(spec: PDClusterSpec, role: str) -> list[str]:
    """The command of a vLLM group's non-leader node: the same ``vllm serve`` arguments (the
    container's args, passed through ``"$@"``) plus ``--headless`` and its first DP rank,
    LWS_WORKER_INDEX x ranks per node, which only a shell can compute."""
    par: RoleParallelism = getattr(spec.parallelism, role)
    local = par.data_parallel_size // nodes_per_instance(spec, role)
    script = (f'exec vllm serve "$@" --headless --data-parallel-start-rank '
              f'"$(({LWS_WORKER_INDEX} * {local}))"')
    return ["/bin/sh", "-c", script, "vllm-serve"]
