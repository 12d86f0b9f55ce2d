"""The pure part of ``pdscale profile run``: which aiperf runs a sweep makes, the command line of
each, when a grid has covered the SLO region, what the progress says, and the manifests (the
profile's ConfigMap, the in-cluster Job). No process, no clock, no cluster: the caller
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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # scipy behind these; the command line imports this module lazily anyway
    from pdscale.planner.model import Slo
    from pdscale.planner.profile import Profile
    from pdscale.planner.profile_fit import Benchmark

PREFILL, DECODE = "prefill", "decode"
#: the shortest rows that may stop early: three prompt lengths separate the prefill curvature
#: from the per-token cost and the overhead; two batch sizes the decode step from the
#: per-sequence cost (planner/profile_fit/fit.py)
MIN_RUNS = {PREFILL: 3, DECODE: 2}
#: the environment variable naming aiperf when ``--aiperf`` is not given (as the opt-in tests)
AIPERF_ENV = "PDSCALE_AIPERF"
#: the field manager and managed-by label of what ``profile run`` writes in a cluster
MANAGER = "pdscale-profile-run"


class SweepError(ValueError):
    """A sweep that cannot start as asked; the message names the flag or field."""


@dataclass(frozen=True)
class Grid:
    """What a sweep measures. Lengths in tokens; requests per run."""

    #: prompt lengths of the prefill row, sent one at a time; up to past the TTFT target's
    #: length on most engines (the row stops once a prompt takes 80% of the target)
    prefill_lengths: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
    #: requests per prompt length (repeats average the noise out of the curvature)
    prefill_requests: int = 8
    #: output tokens of a prefill request: the row measures time to first token, but its
    #: requests are batch-1 decode points too, and a short one reads fast (through the
    #: sglang-router, 8 tokens read 15-19% under the model's step, 64 within 2%: the closed
    #: loop, tests/planner/test_profile_run_closed.py); 32 keeps that to a few percent
    prefill_output_tokens: int = 32
    #: input lengths of the decode rows: the per-context cost needs at least two
    decode_contexts: tuple[int, ...] = (256, 2048, 8192)
    #: concurrencies of each decode row, growing (the row stops once the batch is covered)
    decode_concurrencies: tuple[int, ...] = (2, 8, 16, 32, 64, 128, 256)
    #: output tokens of a decode request: enough that it decodes alongside the others
    decode_output_tokens: int = 128
    #: requests per decode run, per unit of concurrency (3: each of the C clients sends three)
    decode_requests_per_client: int = 3


@dataclass(frozen=True)
class Run:
    """One aiperf run: a fixed concurrency of identical requests."""

    stage: str
    input_tokens: int
    output_tokens: int
    concurrency: int
    requests: int

    @property
    def name(self) -> str:
        return f"{self.stage}-isl{self.input_tokens}-c{self.concurrency}"

    def describe(self) -> str:
        return (f"{self.stage} {self.input_tokens} tokens in, {self.output_tokens} out, "
                f"concurrency {self.concurrency}, {self.requests} requests")


@dataclass(frozen=True)
class Row:
    """Runs stopped together: the prefill lengths, or one context's concurrencies."""

    stage: str
    runs: tuple[Run, ...]

    @property
    def label(self) -> str:
        return PREFILL if self.stage == PREFILL else f"decode at {self.runs[0].input_tokens} tokens"


@dataclass(frozen=True)
class Target:
    """What aiperf sends requests to: the router (or gateway) of a PD deployment."""

    url: str
    #: the served model name requests carry
    model: str
    #: aiperf's --tokenizer: a hub id or a local directory; None = aiperf's default (the model)
    tokenizer: str | None = None
    endpoint_type: str = "completions"


def rows(grid: Grid, max_context_tokens: int | None = None) -> list[Row]:
    """The sweep's rows in the order they run: prefill first (its fit is what the decode rows'
    prompts queue behind), then one decode row per context, shortest first. A run whose
    prompt and output would pass ``max_context_tokens`` is left out (the engines refuse it)."""
    problems = grid_problems(grid)
    if problems:
        raise SweepError("; ".join(problems))

    def fits(isl: int, osl: int) -> bool:
        return max_context_tokens is None or isl + osl <= max_context_tokens

    out = [Row(PREFILL, tuple(
        Run(PREFILL, n, grid.prefill_output_tokens, 1, grid.prefill_requests)
        for n in sorted(grid.prefill_lengths) if fits(n, grid.prefill_output_tokens)))]
    for ctx in sorted(grid.decode_contexts):
        if fits(ctx, grid.decode_output_tokens):
            out.append(Row(DECODE, tuple(
                Run(DECODE, ctx, grid.decode_output_tokens, c, c * grid.decode_requests_per_client)
                for c in sorted(grid.decode_concurrencies))))
    out = [r for r in out if r.runs]
    if not out:
        raise SweepError(f"no run fits the model's context of {max_context_tokens} tokens")
    return out


def grid_problems(grid: Grid) -> list[str]:
    """Each grid flag's problem, named by the flag."""
    out = []
    for flag, values in (("--prefill-lengths", grid.prefill_lengths),
                         ("--decode-contexts", grid.decode_contexts),
                         ("--decode-concurrencies", grid.decode_concurrencies)):
        if any(v < 1 for v in values):
            out.append(f"{flag}: every value must be a positive integer")
        elif len(set(values)) != len(values):
            out.append(f"{flag}: a value is repeated")
    for flag, count in (("--prefill-requests", grid.prefill_requests),
                        ("--decode-requests-per-client", grid.decode_requests_per_client)):
        if count < 1:
            out.append(f"{flag}: must be at least 1")
    for flag, tokens in (("--prefill-output-tokens", grid.prefill_output_tokens),
                         ("--decode-output-tokens", grid.decode_output_tokens)):
        if tokens < 2:  # a request of one output token has no inter-token latency
            out.append(f"{flag}: must be at least 2")
    if grid.prefill_lengths and len(grid.prefill_lengths) < 2:
        out.append("--prefill-lengths: the prefill fit needs at least two lengths")
    return out


def aiperf_command(aiperf: str, target: Target, run: Run, artifact_dir: str,
                   extra: Sequence[str] = ()) -> list[str]:
    """aiperf 0.13's ``profile`` command for one run, as tests/planner/test_profile_fit_closed.py
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


def aiperf_environment(environ: Mapping[str, str], *, local_tokenizer: bool) -> dict[str, str]:
    """aiperf's environment: ours, less ``HF_HUB_OFFLINE`` when the tokenizer is a local
    directory (aiperf 0.13 then treats the path as a hub name and fails)."""
    env = dict(environ)
    if local_tokenizer:
        env.pop("HF_HUB_OFFLINE", None)
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


# -- when a row has covered the SLO region ------------------------------------------------------

def row_shortfall(row: Row, fitted: Profile, row_benchmarks: Sequence[Benchmark], base: Profile,
                  slo: Slo, *, kv_transfer_in_ttft: bool | None = None) -> str | None:
    """What ``profile fit``'s coverage rule still finds missing in the runs of ``row`` so far
    (None: covered). Prefill: the longest prompt's compute time (its TTFT less the base's KV
    hand-off, as the fit sees it) against the TTFT target; decode: the largest batch of the
    row against the batch ``fitted`` runs at the TPOT target, at the row's context."""
    from pdscale.planner.profile_fit import (
        decode_coverage,
        prefill_compute_points,
        prefill_coverage,
    )

    if row.stage == PREFILL:
        points, _ = prefill_compute_points(row_benchmarks, base, kv_transfer_in_ttft)
        if not points:
            return "no prompt ran alone in prefill yet"
        return prefill_coverage(points, slo)
    decode = [p for b in row_benchmarks for p in b.decode]
    if not decode:
        return "no decode point yet"
    return decode_coverage(fitted, decode, slo)


def stops_after(row: Row, runs_done: int, shortfall: str | None) -> bool:
    """Whether ``row`` stops after its first ``runs_done`` runs: covered, and enough runs for
    the fit to separate the row's terms (:data:`MIN_RUNS`)."""
    return shortfall is None and runs_done >= MIN_RUNS[row.stage] and runs_done < len(row.runs)


# -- progress ---------------------------------------------------------------------------------

def clock_text(seconds: float) -> str:
    seconds = max(0, round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def progress_start(i: int, n: int, run: Run, elapsed: float) -> str:
    return f"[{i}/{n} {clock_text(elapsed)}] {run.describe()} ..."


def progress_done(i: int, n: int, run: Run, seconds: float, elapsed: float,
                  shortfall: str | None) -> str:
    state = "SLO region covered" if shortfall is None else f"not covered yet: {shortfall}"
    return f"[{i}/{n} {clock_text(elapsed)}] {run.name} done in {seconds:.1f} s; {state}"


def progress_skip(row: Row, skipped: Sequence[Run]) -> str:
    what = ", ".join(str(r.input_tokens if row.stage == PREFILL else r.concurrency)
                     for r in skipped)
    unit = "tokens" if row.stage == PREFILL else "concurrency"
    return f"{row.label}: SLO region covered, early stop: skipping {unit} {what}"


# -- what the sweep leaves in the profile -------------------------------------------------------

@dataclass
class RunRecord:
    """One run as the provenance lists it."""

    run: Run
    status: str  # done | failed
    seconds: float
    artifacts: str


@dataclass
class SweepRecord:
    """What the sweep did: its target, grid, runs, early stops and, if it stopped, why."""

    target: Target
    grid: Grid
    runs: list[RunRecord] = field(default_factory=list)
    early_stops: list[str] = field(default_factory=list)
    failed: str | None = None


def sweep_provenance(record: SweepRecord) -> dict[str, Any]:
    """The ``provenance.sweep`` block of a profile ``profile run`` fitted (small: the profile's
    points are already under ``provenance.points``)."""
    g = record.grid
    return {
        "target": {"url": record.target.url, "model": record.target.model,
                   "tokenizer": record.target.tokenizer,
                   "endpoint_type": record.target.endpoint_type},
        "grid": {"prefill_lengths": list(g.prefill_lengths),
                 "prefill_requests": g.prefill_requests,
                 "prefill_output_tokens": g.prefill_output_tokens,
                 "decode_contexts": list(g.decode_contexts),
                 "decode_concurrencies": list(g.decode_concurrencies),
                 "decode_output_tokens": g.decode_output_tokens,
                 "decode_requests_per_client": g.decode_requests_per_client},
        "runs": [{"name": r.run.name, "status": r.status, "seconds": round(r.seconds, 1),
                  "requests": r.run.requests} for r in record.runs],
        "early_stop": list(record.early_stops),
        "stopped": record.failed,
    }


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

