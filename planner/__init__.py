"""The pure planning core: observation -> forecast -> performance model -> solve -> decision.

Nothing here imports kopf, a Kubernetes client or an HTTP library, does I/O in the planning
path or reads a clock: time comes in as an argument. A layering contract checks this.

Public API, by module (imported from the module, so that importing the package stays cheap
for callers that need only one part, e.g. the metrics reader):

- ``observe``: :class:`Observation`, :class:`Reading` (value + time; stale -> unknown),
  :class:`RoleState`, :class:`Warming`.
- ``decision``: :class:`Decision` (targets, predicted TTFT/TPOT, cost, explanation).
- ``profile``: :func:`shipped_profile` (by name: the operator's), :func:`load_profile` (a
  file or a name: the command line's), :func:`parse_profile`, :class:`ProfileError`.
- ``model``: :class:`PerformanceModel`, :class:`Load`, :class:`Slo`, :func:`calibrate`,
  :func:`calibrate_slo`.
- ``forecast``: :func:`forecast`, :func:`backtest`.
- ``config``: :class:`PlannerConfig` (validated on construction) and :func:`build_config`,
  called by the one mapping from a PDCluster spec (``operator/loop/planning.py``) that the
  operator, ``pdscale replay`` and the benchmarks share.
- ``solve``: :func:`plan`, :func:`step`, :class:`History`.
- ``prometheus``: the metrics reader, the runtime's only I/O module (HTTP to Prometheus).

The replay harness (simulator, policies, traces) is the subpackage ``pdscale.planner.replay``;
it imports this package, never the other way round.
"""
