"""The test bed: what stands in for GPUs, clusters and load on a machine without them.

Not part of the product: the operator, the planner and the ``pdscale`` command never import it
(an import contract checks that). Installed with the ``testbed`` extra, it adds the ``pdscale
demo`` and ``pdscale cluster`` subcommands through the ``pdscale.commands`` entry points.

- ``localcluster``: a real etcd, kube-apiserver, controllers, scheduler and kwok, as processes.
- ``nodes``: fake 8xH200 and CPU nodes, API clients, the operator's kubeconfig.
- ``localprometheus``: a real Prometheus scraping what runs here.
- ``simengine``: simulated SGLang and vLLM engines that speak their HTTP and metrics.
- ``simfleet``: one simulated engine for every engine pod the operator creates.
- ``loadgen``: the phased load generator; ``stack``: the whole product running here;
  ``demo``: ``pdscale demo``; ``fixtures``: pytest fixtures for the cluster tiers.
"""
