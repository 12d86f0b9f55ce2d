"""The command line's pure part of ``pdscale profile run``: the aiperf command line of each run,
what the progress says, and the manifests (the profile's ConfigMap, the in-cluster Job). Which
runs a sweep makes and when a row has covered the SLO region is the planner's
(:mod:`pdscale.planner.profile_fit.sweep`). No process, no clock, no cluster: the caller
(:mod:`pdscale.profile_run`) runs aiperf, times it and writes files.

A sweep is a list of rows, each run in order and stopped early on its own:

* the **prefill** row: prompts of growing length sent one at a time (concurrency 1), each a
  clean prefill measurement; it stops once the longest prompt's prefill reaches the TTFT
  target's region;
* one **decode** row per context length: growing concurrency, so that the decode batch grows;
  it stops once the batch reaches the region of the batch the fitted profile runs at the TPOT
  target.

"Reaches the region" is the coverage rule ``pdscale profile fit`` warns with
(:func:`pdscale.planner.profile_fit.prefill_coverage` and ``decode_coverage``, at
``SLO_COVERAGE`` = 80% of the target): a sweep that stops early leaves a profile that fit
does not warn about, and never a second rule that could disagree with it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pdscale.planner.profile_fit.sweep import (
    Grid,
    Run,
    SweepError,
    Target,
)

#: the environment variable naming aiperf when ``--aiperf`` is not given (as the opt-in tests)
AIPERF_ENV = "PDSCALE_AIPERF"
#: the field manager and managed-by label of what ``profile run`` writes in a cluster
MANAGER = "pdscale-profile-run"


def aiperf_command(aiperf: str, target: Target, run: Run, artifact_dir: str,
                   extra: Sequence[str] = ()) -> list[str]:
    """aiperf 0.13's ``profile`` command for one run, as tests/planner/test_profile_run_closed.py
    runs it: fixed input and output lengths (``--isl-stddev 0``, ``ignore_eos`` so that every
    request decodes its full output), a fixed seed, streaming (the TTFT needs it), no UI.
    ``extra`` goes last, so that a user's flag can override ours."""
    cmd = [aiperf, "profile", "--url", target.url, "--endpoint-type", target.endpoint_type,
           "--streaming", "--model", target.model]
    if target.tokenizer:
        cmd += ["--tokenizer", target.tokenizer]
    cmd += ["--isl", str(run.input_tokens), "--isl-stddev", "0",
            "--osl", str(run.output_tokens), "--concurrency", str(run.concurrency),
            "--request-count", str(run.requests), "--random-seed", "1",
            "--extra-inputs", "ignore_eos:true", "--ui-type", "none",
            "--artifact-dir", artifact_dir]
    return cmd + list(extra)


def aiperf_environment(environ: Mapping[str, str], *, local_tokenizer: bool,
                       scratch_dir: str | None = None) -> dict[str, str]:
    """aiperf's environment: ours, less ``HF_HUB_OFFLINE`` when the tokenizer is a local
    directory (aiperf 0.13 then treats the path as a hub name and fails), with ``TMPDIR`` at
    ``scratch_dir`` when given: aiperf leaves its dataset's ``aiperf_mmap_<id>`` folder and a
    ``tmp*/aiperf`` folder in the temp dir after every run, so the caller gives it one it
    removes."""
    env = dict(environ)
    if local_tokenizer:
        env.pop("HF_HUB_OFFLINE", None)
    if scratch_dir is not None:
        env["TMPDIR"] = scratch_dir
    return env


def find_aiperf(flag: str | None, environ: Mapping[str, str],
                which: Callable[[str], str | None]) -> str:
    """The aiperf executable: ``--aiperf``, else ``$PDSCALE_AIPERF``, else ``aiperf`` on PATH.

    Raises
    ------
    SweepError
        When none is there, naming the flag and how to get one."""
    if flag:
        found = which(flag)
        if found is None:
            raise SweepError(f"--aiperf {flag}: not an executable")
        return found
    if environ.get(AIPERF_ENV):
        found = which(environ[AIPERF_ENV])
        if found is None:
            raise SweepError(f"{AIPERF_ENV}={environ[AIPERF_ENV]}: not an executable")
        return found
    found = which("aiperf")
    if found is None:
        raise SweepError(f"aiperf not found: pass --aiperf PATH or set {AIPERF_ENV} (aiperf is "
                         "not a pdscale dependency: `python -m venv V && V/bin/pip install "
                         "aiperf==0.13.0`, then --aiperf V/bin/aiperf)")
    return found


# -- what the sweep leaves in the profile -------------------------------------------------------


def profile_configmap(name: str, text: str, *, namespace: str | None, key: str | None = None
                      ) -> dict[str, Any]:
    """A ConfigMap holding a profile YAML under ``key`` (default ``profile.yaml``), in the form
    ``spec.planner.profileConfigMap`` reads, checked by the operator's own reader
    (:func:`pdscale.operator.loop.profile_source.profile_from_configmap`: size limit, YAML,
    every field).

    Raises
    ------
    SweepError
        When the operator would refuse it (naming what it refuses)."""
    from pdscale.operator.api.pdcluster import PROFILE_CONFIGMAP_KEY, ProfileConfigMapRef
    from pdscale.operator.loop.profile_source import profile_from_configmap
    from pdscale.planner.profile import ProfileError

    try:
        ref = ProfileConfigMapRef(name=name, key=key or PROFILE_CONFIGMAP_KEY)
    except ValueError as exc:
        raise SweepError(f"--configmap {name!r}: not a ConfigMap name "
                         f"({' '.join(str(exc).split())[:200]})") from None
    meta: dict[str, Any] = {"name": name, "labels": {
        "app.kubernetes.io/name": "pdscale", "app.kubernetes.io/component": "profile",
        "app.kubernetes.io/managed-by": MANAGER}}
    if namespace:
        meta["namespace"] = namespace
    manifest = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
                "data": {ref.key: text}}
    try:
        profile_from_configmap(manifest, ref, namespace or "(namespace)")
    except ProfileError as exc:
        raise SweepError(str(exc)) from None
    return manifest


# -- a PDCluster as the target; the same sweep as a Job in its namespace -----------------------

@dataclass(frozen=True)
class ClusterTarget:
    """What a PDCluster document says about where and how to sweep it."""

    namespace: str
    name: str
    #: the router Service's in-cluster URL
    target: Target
    ttft_seconds: float
    tpot_seconds: float
    max_context_tokens: int
    #: the shipped profile the PDCluster plans with, as the fit's base (None: a ConfigMap's)
    base: str | None


def pdcluster_target(doc: Any, namespace: str | None, tokenizer: str | None) -> ClusterTarget:
    """The router Service URL, served model, SLO and context of a PDCluster document (pure).

    The tokenizer: ``tokenizer`` if given, else the model's hub id when the engines download
    it; a model loaded from a volume needs ``--tokenizer`` (its path is inside the pods).

    Raises
    ------
    SweepError
        Not a valid PDCluster (the operator's own field-naming messages), or no tokenizer."""
    from pdscale.operator.api.names import child_name
    from pdscale.operator.api.pdcluster import GROUP, KIND
    from pdscale.operator.render.checklist import SpecError, validate

    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise SweepError(f"-f: not a {GROUP} {KIND} document")
    raw_meta = doc.get("metadata")
    meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise SweepError("-f: metadata.name: required")
    ns = meta.get("namespace") or namespace or "default"
    try:
        spec, _ = validate(doc.get("spec") if isinstance(doc.get("spec"), dict) else None)
    except SpecError as exc:
        raise SweepError("-f: " + "; ".join(str(p) for p in exc.problems)) from None
    if tokenizer is None and spec.model.weights is not None:
        raise SweepError("--tokenizer: the PDCluster loads its model from a volume "
                         f"(spec.model.weights, {spec.model.path}), which aiperf cannot read "
                         "from here: name the tokenizer (a hub id or a local directory)")
    url = f"http://{child_name(name, 'router')}.{ns}.svc:{spec.router.port}"
    planner = spec.planner
    return ClusterTarget(
        namespace=ns, name=name,
        target=Target(url, spec.model.served_name, tokenizer or spec.model.path),
        ttft_seconds=spec.slo.ttft_seconds, tpot_seconds=spec.slo.tpot_seconds,
        max_context_tokens=spec.model.max_context_length_tokens,
        base=None if planner.profile_config_map is not None else planner.profile)


@dataclass(frozen=True)
class JobSettings:
    """The in-cluster sweep: which image runs it (pdscale and aiperf installed), where it
    writes the profile, and the pod's size and time limit."""

    image: str
    configmap: str
    configmap_key: str | None = None
    service_account: str = "pdscale-profile-run"
    cpu: str = "2"
    memory: str = "4Gi"
    deadline_seconds: int = 6 * 3600
    #: the aiperf executable inside the image
    aiperf: str = "aiperf"


#: where the Job's pod writes (an emptyDir: the root filesystem is read-only)
JOB_WORKDIR = "/work"


def sweep_arguments(target: Target, grid: Grid, *, ttft_seconds: float, tpot_seconds: float,
                    base: str | None, max_context_tokens: int | None,
                    run_timeout_seconds: float | None = None,
                    aiperf_args: Sequence[str] = ()) -> list[str]:
    """``pdscale profile run``'s flags for this sweep (the Job runs the same command)."""
    out = ["--url", target.url, "--model", target.model, "--endpoint-type", target.endpoint_type]
    if target.tokenizer:
        out += ["--tokenizer", target.tokenizer]
    out += ["--slo-ttft", f"{ttft_seconds:g}", "--slo-tpot", f"{tpot_seconds:g}",
            "--prefill-lengths", _ints(grid.prefill_lengths),
            "--prefill-requests", str(grid.prefill_requests),
            "--prefill-output-tokens", str(grid.prefill_output_tokens),
            "--decode-contexts", _ints(grid.decode_contexts),
            "--decode-concurrencies", _ints(grid.decode_concurrencies),
            "--decode-output-tokens", str(grid.decode_output_tokens),
            "--decode-requests-per-client", str(grid.decode_requests_per_client)]
    if base:
        out += ["--base", base]
    if max_context_tokens is not None:
        out += ["--max-context-tokens", str(max_context_tokens)]
    if run_timeout_seconds is not None:
        out += ["--run-timeout", f"{run_timeout_seconds:g}"]
    for arg in aiperf_args:
        out.append(f"--aiperf-arg={arg}")
    return out


def _ints(values: Sequence[int]) -> str:
    return ",".join(str(v) for v in values)


def sweep_job(cluster: ClusterTarget, settings: JobSettings, arguments: Sequence[str]
              ) -> list[dict[str, Any]]:
    """The ServiceAccount, Role, RoleBinding and Job that run ``pdscale profile run
    ARGUMENTS`` in the PDCluster's namespace against its router Service and write the profile
    to ConfigMap ``settings.configmap`` there (pure).

    The Role grants what writing that one ConfigMap needs and nothing else: ``create`` on
    configmaps (creation cannot be limited by name), ``get`` and ``patch`` on that name. The
    pod runs as the operator's own pods do (restricted Pod Security Standard: non-root, no
    privilege escalation, every capability dropped, read-only root, RuntimeDefault seccomp);
    it writes in an emptyDir. One attempt (``backoffLimit: 0``): a failed sweep is read from
    its log, not silently run again against a serving deployment."""
    from pdscale.operator.api.names import base_name

    job_name = f"{base_name(cluster.name)}-profile-run"
    labels = {"app.kubernetes.io/name": "pdscale", "app.kubernetes.io/component": "profile-run",
              "app.kubernetes.io/instance": base_name(cluster.name),
              "app.kubernetes.io/managed-by": MANAGER}

    def meta(name: str) -> dict[str, Any]:
        return {"name": name, "namespace": cluster.namespace, "labels": dict(labels)}

    command = ["pdscale", "profile", "run", *arguments, "--aiperf", settings.aiperf,
               "-o", f"{JOB_WORKDIR}/profile.yaml", "--workdir", f"{JOB_WORKDIR}/runs",
               "--configmap", settings.configmap, "--namespace", cluster.namespace,
               "--apply-configmap"]
    if settings.configmap_key:
        command += ["--configmap-key", settings.configmap_key]
    container = {
        "name": "profile-run",
        "image": settings.image,
        "command": command,
        "env": [{"name": "HOME", "value": JOB_WORKDIR},
                {"name": "HF_HOME", "value": f"{JOB_WORKDIR}/huggingface"}],
        "resources": {"requests": {"cpu": settings.cpu, "memory": settings.memory},
                      "limits": {"memory": settings.memory}},
        "securityContext": {"allowPrivilegeEscalation": False, "privileged": False,
                            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "work", "mountPath": JOB_WORKDIR},
                         {"name": "tmp", "mountPath": "/tmp"}],
    }
    job = {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": meta(job_name),
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": settings.deadline_seconds,
            "ttlSecondsAfterFinished": 7 * 24 * 3600,
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "serviceAccountName": settings.service_account,
                    "restartPolicy": "Never",
                    "enableServiceLinks": False,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532,
                                        "runAsGroup": 65532,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [container],
                    "volumes": [{"name": "work", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(job_name),
        "rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [settings.configmap],
             "verbs": ["get", "patch"]},
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": meta(job_name),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": job_name},
        "subjects": [{"kind": "ServiceAccount", "name": settings.service_account,
                      "namespace": cluster.namespace}],
    }
    account = {"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": meta(settings.service_account)}
    return [account, role, binding, job]

