"""The evaluation harness: recorded load replayed through a policy on a simulated PD fleet.

It imports the runtime planner (the same pure ``step()`` the operator runs) and nothing of the
operator, the command line or the test bed; the runtime planner never imports it.

- ``traces``: :func:`load_trace`, the readers, :func:`scale_trace`, :class:`TraceError`.
- ``simulate``: :func:`simulate`, :class:`SimConfig` (the discrete-event PD fleet), built from
  its parts: ``fleet`` (instances warming, serving, draining; the event heap), ``routers``
  (one class per routing policy), ``prefix_index`` (cache hits per instance),
  ``prefill_batches`` and ``decode_batches`` (how the engines batch; decode admission off /
  queue / shed), ``router_admission`` (smg's) and ``interval_stats`` (what each interval observes).
- ``policies``: the policies compared in replay (pdscale, reactive, sla-interp, static, oracle).
- ``run``: :class:`ReplaySetup` (a trace, the planner's configuration as the operator would
  run it for a PDCluster, and the simulated fleet's own knobs) and :func:`run_policy`, what
  ``pdscale replay`` and the benchmarks call.
- ``workloads``: the global-scheduling article's multi-turn chat workload.
"""
