"""``pdscale profile run``: measure a PD deployment with aiperf and fit its profile.

Runs aiperf (not a pdscale dependency: ``--aiperf``, ``$PDSCALE_AIPERF`` or ``aiperf`` on
PATH) against the router of a deployment, one run at a time: a prefill row of prompt lengths
at concurrency 1, then a decode row of concurrencies per context length. After each run it
fits what is there and stops a row once it covers the SLO region (the rule ``profile fit``
warns with). Every run's aiperf artifacts stay in ``--workdir``; the profile is fitted from
all of them by the code ``profile fit`` runs. Examples:

    pdscale profile run --url http://localhost:30000 --model my-model --tokenizer org/model \\
        --slo-ttft 2 --slo-tpot 0.05 -o mine.yaml --configmap my-profile
    pdscale profile run -f pdcluster.yaml --render-job --job-image REGISTRY/pdscale-aiperf:TAG \\
        --configmap my-profile | kubectl apply -f -

Exit status 2 when the sweep cannot start (the message names the flag) or a run fails (its
stderr tail is shown; the finished runs are kept, and fitted when they determine a profile).

The sweep itself (grid, rows run in order, early stop, progress lines) is the planner's
(:mod:`pdscale.planner.profile_fit.sweep`); aiperf's command line and the manifests are
:mod:`pdscale.profile_sweep`; this module runs aiperf processes and writes files.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pdscale.planner.model import Slo
    from pdscale.planner.profile import Profile
    from pdscale.planner.profile_fit import Benchmark, FittedProfile
    from pdscale.planner.profile_fit.sweep import Grid, Outcome, Run, SweepRecord, Target

HEADER = """\
# Fitted by `pdscale profile run`: aiperf runs against the deployment under provenance.sweep
# (its grid, the runs made and where each row stopped early), fitted as `pdscale profile fit`
# fits them. Terms under provenance.terms with identified: false were not determined by the
# points; provenance.residuals says how far the model's form is from the points.
"""
#: lines of a failed run's stderr shown
STDERR_TAIL_LINES = 25


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want integers separated by commas") from None


def _text(values: Sequence[int]) -> str:
    return ",".join(str(v) for v in values)


def add_arguments(actions: Any) -> None:
    """The ``run`` action of ``pdscale profile`` (stdlib only: building the command line
    imports nothing heavy)."""
    from pdscale.planner.profile_fit.sweep import Grid

    g = Grid()
    run = actions.add_parser(
        "run", help="measure a PD deployment with aiperf and fit its profile",
        description=__doc__.split("\n\nThe pure part")[0].split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    where = run.add_argument_group("target")
    where.add_argument("--url", help="the router's (or gateway's) URL; with -f, overrides the "
                                     "router Service's in-cluster URL")
    where.add_argument("-f", "--filename", metavar="PDCLUSTER.yaml",
                       help="a PDCluster: its router Service URL, served model, SLO, context "
                            "length and shipped profile (as the base) are the defaults")
    where.add_argument("-n", "--namespace", help="the PDCluster's (and the ConfigMap's) "
                                                 "namespace when the document names none")
    where.add_argument("--model", help="the served model name (default with -f: "
                                       "spec.model.servedName)")
    where.add_argument("--tokenizer", help="aiperf's tokenizer: a hub id or a local directory "
                                           "(default with -f: spec.model.path)")
    where.add_argument("--endpoint-type", choices=("completions", "chat"), default="completions")
    where.add_argument("--aiperf", help="the aiperf executable (default: $PDSCALE_AIPERF, else "
                                        "aiperf on PATH)")
    where.add_argument("--aiperf-arg", action="append", default=[], metavar="ARG",
                       help="one more argument for every aiperf run (repeat; --aiperf-arg=--x)")
    where.add_argument("--run-timeout", type=float, default=3600.0,
                       help="seconds one aiperf run may take before it is stopped (a failure)")
    grid = run.add_argument_group("grid")
    grid.add_argument("--prefill-lengths", type=_ints, default=_text(g.prefill_lengths), metavar="N,N,...",
                      help="prompt lengths at concurrency 1, tokens (default %(default)s)")
    grid.add_argument("--prefill-requests", type=int, default=g.prefill_requests,
                      help="requests per prompt length (default %(default)s)")
    grid.add_argument("--prefill-output-tokens", type=int, default=g.prefill_output_tokens,
                      help="output tokens of a prefill request (default %(default)s)")
    grid.add_argument("--decode-contexts", type=_ints, default=_text(g.decode_contexts), metavar="N,N,...",
                      help="input lengths of the decode rows, tokens (default %(default)s)")
    grid.add_argument("--decode-concurrencies", type=_ints, default=_text(g.decode_concurrencies),
                      metavar="C,C,...", help="concurrencies of each decode row (default %(default)s)")
    grid.add_argument("--decode-output-tokens", type=int, default=g.decode_output_tokens,
                      help="output tokens of a decode request (default %(default)s)")
    grid.add_argument("--decode-requests-per-client", type=int,
                      default=g.decode_requests_per_client,
                      help="requests per decode run per unit of concurrency (default %(default)s)")
    grid.add_argument("--max-context-tokens", type=int,
                      help="leave out runs longer than this (default with -f: "
                           "spec.model.maxContextLengthTokens)")
    out = run.add_argument_group("output")
    out.add_argument("-o", "--output", type=Path, help="profile YAML to write")
    out.add_argument("--workdir", type=Path, help="where each run's aiperf artifacts are kept "
                                                  "(default: OUTPUT's name + '-runs' beside it); "
                                                  "must be new or empty")
    out.add_argument("--base", help="profile giving what the points do not determine (default: "
                                    "the PDCluster's shipped profile with -f, else the default)")
    out.add_argument("--name", help="the fitted profile's name (default: the output's stem)")
    out.add_argument("--slo-ttft", type=float, help="TTFT target, seconds (default: the "
                                                    "PDCluster's with -f, else 2)")
    out.add_argument("--slo-tpot", type=float, help="TPOT target, seconds (default: the "
                                                    "PDCluster's with -f, else 0.05)")
    out.add_argument("--configmap", metavar="NAME", help="also write a ConfigMap manifest "
                     "holding the profile, for spec.planner.profileConfigMap")
    out.add_argument("--configmap-key", help="its key (default profile.yaml)")
    out.add_argument("--configmap-output", type=Path, help="where the manifest goes (default: "
                                                           "OUTPUT's name + '-configmap.yaml')")
    out.add_argument("--apply-configmap", action="store_true",
                     help="write the ConfigMap into the cluster as well ($KUBECONFIG or the "
                          "pod's ServiceAccount; what the Job does)")
    job = run.add_argument_group("in-cluster Job (--render-job)")
    job.add_argument("--render-job", action="store_true",
                     help="print the Job (with its ServiceAccount and Role) that runs this sweep "
                          "in the PDCluster's namespace and writes --configmap; needs -f")
    job.add_argument("--job-image", help="an image with pdscale and aiperf installed (the "
                                         "operator's image has no aiperf)")
    job.add_argument("--job-service-account", default="pdscale-profile-run")
    job.add_argument("--job-cpu", default="2")
    job.add_argument("--job-memory", default="4Gi")
    job.add_argument("--job-deadline-seconds", type=int, default=6 * 3600)


class Refused(Exception):
    """The sweep cannot go on as asked; the message names the flag or the run."""


@dataclass
class Settings:
    """The parsed flags, with the PDCluster's defaults filled in."""

    target: Target
    grid: Grid
    slo: Slo
    base: Profile
    base_name: str | None
    max_context_tokens: int | None
    namespace: str | None


def run(args: argparse.Namespace) -> int:
    from pdscale.planner.profile_fit.sweep import SweepError

    try:
        if args.render_job:
            return render_job(args)
        return sweep_command(args)
    except (Refused, SweepError) as exc:
        print(f"pdscale profile run: error: {exc}", file=sys.stderr)
        return 2


def _cluster(args: argparse.Namespace) -> Any:
    """The PDCluster of ``-f`` (a ClusterTarget), or None."""
    if not args.filename:
        return None
    from pdscale.profile_sweep import pdcluster_target
    from pdscale.spec_file import SpecFileError, read

    try:
        docs = [d.data for d in read(args.filename) if d.data is not None]
    except (OSError, SpecFileError) as exc:
        raise Refused(f"-f {args.filename}: {exc}") from None
    if len(docs) != 1:
        raise Refused(f"-f {args.filename}: want one PDCluster document, found {len(docs)}")
    return pdcluster_target(docs[0], args.namespace, args.tokenizer)


def settings(args: argparse.Namespace, cluster: Any = None) -> Settings:
    """The flags, with the defaults of ``cluster`` (the ClusterTarget of ``-f``) filled in."""
    from pdscale.planner.model import Slo
    from pdscale.planner.profile import ProfileError, load_profile
    from pdscale.planner.profile_fit.sweep import Grid, Target

    url = args.url or (cluster.target.url if cluster else None)
    model = args.model or (cluster.target.model if cluster else None)
    if not url:
        raise Refused("--url: required (the router's URL), or -f PDCLUSTER.yaml")
    if not model:
        raise Refused("--model: required (the served model name), or -f PDCLUSTER.yaml")
    tokenizer = args.tokenizer or (cluster.target.tokenizer if cluster else None)
    base_name = args.base or (cluster.base if cluster else None)
    try:
        base = load_profile(base_name)
    except ProfileError as exc:
        raise Refused(f"--base: {exc}") from None
    slo = Slo(ttft_seconds=args.slo_ttft or (cluster.ttft_seconds if cluster else 2.0),
              tpot_seconds=args.slo_tpot or (cluster.tpot_seconds if cluster else 0.05))
    grid = Grid(prefill_lengths=args.prefill_lengths, prefill_requests=args.prefill_requests,
                prefill_output_tokens=args.prefill_output_tokens,
                decode_contexts=args.decode_contexts,
                decode_concurrencies=args.decode_concurrencies,
                decode_output_tokens=args.decode_output_tokens,
                decode_requests_per_client=args.decode_requests_per_client)
    return Settings(Target(url, model, tokenizer, args.endpoint_type), grid, slo, base, base_name,
                    args.max_context_tokens or (cluster.max_context_tokens if cluster else None),
                    args.namespace or (cluster.namespace if cluster else None))


def render_job(args: argparse.Namespace) -> int:
    from pdscale.planner.profile import shipped_profiles
    from pdscale.planner.profile_fit.sweep import rows
    from pdscale.profile_sweep import JobSettings, sweep_arguments, sweep_job
    from pdscale.render import dump

    if not args.filename:
        raise Refused("--render-job: needs -f PDCLUSTER.yaml (the Job runs in its namespace, "
                      "against its router Service)")
    if not args.job_image:
        raise Refused("--job-image: required with --render-job (an image with pdscale and "
                      "aiperf installed; the operator's image has no aiperf)")
    if not args.configmap:
        raise Refused("--configmap: required with --render-job (where the Job writes the profile)")
    cluster = _cluster(args)
    s = settings(args, cluster)
    rows(s.grid, s.max_context_tokens)  # refuse a grid now, not in the pod
    if s.base_name and s.base_name not in shipped_profiles():
        raise Refused(f"--base {s.base_name}: the Job's pod cannot read a file of this machine; "
                      f"name a shipped profile ({', '.join(shipped_profiles())})")
    arguments = sweep_arguments(s.target, s.grid, ttft_seconds=s.slo.ttft_seconds,
                                tpot_seconds=s.slo.tpot_seconds, base=s.base_name,
                                max_context_tokens=s.max_context_tokens,
                                run_timeout_seconds=args.run_timeout, aiperf_args=args.aiperf_arg)
    if args.name:
        arguments += ["--name", args.name]
    job = JobSettings(image=args.job_image, configmap=args.configmap,
                      configmap_key=args.configmap_key, service_account=args.job_service_account,
                      cpu=args.job_cpu, memory=args.job_memory,
                      deadline_seconds=args.job_deadline_seconds)
    sys.stdout.write(dump(sweep_job(cluster, job, arguments)))
    return 0


def sweep_command(args: argparse.Namespace) -> int:
    """Check everything that can be checked, then sweep, fit, write."""
    from pdscale.planner.profile_fit.sweep import SweepRecord, execute, rows
    from pdscale.profile_sweep import find_aiperf

    if args.output is None:
        raise Refused("-o/--output: required (the profile YAML to write)")
    if args.apply_configmap and not args.configmap:
        raise Refused("--apply-configmap: needs --configmap NAME")
    s = settings(args, _cluster(args))
    aiperf = find_aiperf(args.aiperf, os.environ, shutil.which)
    plan = rows(s.grid, s.max_context_tokens)
    workdir = args.workdir or args.output.with_name(args.output.stem + "-runs")
    if workdir.exists() and (not workdir.is_dir() or any(workdir.iterdir())):
        raise Refused(f"--workdir {workdir}: exists and is not empty (a sweep keeps every run "
                      "there; choose a new one)")
    workdir.mkdir(parents=True, exist_ok=True)
    record = SweepRecord(s.target, s.grid)
    runner = AiperfRunner(aiperf, s.target, args.aiperf_arg, args.run_timeout)
    name = args.name or args.output.stem

    def fit_now(files: Sequence[Path]) -> tuple[FittedProfile, list[Benchmark]]:
        return _fit(files, s, name)

    files = execute(plan, workdir, runner=runner, fit_now=fit_now, slo=s.slo, base=s.base,
                    record=record, say=lambda line: print(line, file=sys.stderr, flush=True),
                    clock=time.monotonic)
    return finish(args, s, record, files, name)


# -- running aiperf -----------------------------------------------------------------------------

class AiperfRunner:
    """Runs one aiperf run in its artifact directory, its output in files beside aiperf's."""

    def __init__(self, aiperf: str, target: Target, extra: Sequence[str], timeout: float):
        self.aiperf, self.target, self.extra, self.timeout = aiperf, target, list(extra), timeout

    def __call__(self, run: Run, directory: Path) -> Outcome:
        from pdscale.planner.profile_fit.sweep import Outcome
        from pdscale.profile_sweep import aiperf_command, aiperf_environment

        directory.mkdir(parents=True)
        cmd = aiperf_command(self.aiperf, self.target, run, str(directory), self.extra)
        (directory / "command.txt").write_text(" ".join(cmd) + "\n")
        # aiperf's own temp dir, removed after the run; short, as aiperf's ZMQ sockets live
        # there and a socket path over 107 characters fails the run (not under `directory`)
        scratch = Path(tempfile.mkdtemp(prefix="pdscale-aiperf-"))
        env = aiperf_environment(os.environ, local_tokenizer=bool(
            self.target.tokenizer and Path(self.target.tokenizer).is_dir()),
            scratch_dir=str(scratch))
        stderr_path = directory / "aiperf.stderr.log"
        began = time.monotonic()
        with (directory / "aiperf.stdout.log").open("w") as out, stderr_path.open("w") as err:
            # its own session: aiperf starts worker processes, stopped with it on a timeout
            proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True)
            try:
                code = proc.wait(self.timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return Outcome(False, time.monotonic() - began,
                               f"stopped after --run-timeout {self.timeout:g} s")
            except BaseException:  # Ctrl-C: take aiperf's workers down with it
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait()
                raise
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        seconds = time.monotonic() - began
        if code != 0:
            return Outcome(False, seconds, f"aiperf exited {code}; stderr ({stderr_path}):\n"
                                           + stderr_tail(stderr_path))
        if not (directory / "profile_export.jsonl").is_file():
            return Outcome(False, seconds, f"aiperf exited 0 but wrote no profile_export.jsonl in "
                                           f"{directory}; stderr:\n" + stderr_tail(stderr_path))
        return Outcome(True, seconds)


def stderr_tail(path: Path, lines: int = STDERR_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return "(no stderr)"
    return "\n".join("    " + line for line in text) or "    (empty)"


# -- the sweep ------------------------------------------------------------------------------

def _fit(files: Sequence[Path], s: Settings, name: str) -> tuple[FittedProfile, list[Benchmark]]:
    from pdscale.planner.profile_fit import read_benchmark
    from pdscale.planner.profile_fit.files import fit_files

    result = fit_files(files, s.base, name=name, base_name=s.base_name, fmt="aiperf", slo=s.slo,
                       kv_transfer_in_ttft=None,
                       fitted_at=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    return result, [read_benchmark(f, "aiperf") for f in files]


# -- the end: fit everything, write the profile and the ConfigMap --------------------------------

def finish(args: argparse.Namespace, s: Settings, record: SweepRecord, files: Sequence[Path],
           name: str) -> int:
    """Fit every finished run, write the profile (and the ConfigMap); 2 when a run failed."""
    from pdscale.planner.profile import ProfileError
    from pdscale.planner.profile_fit import BenchmarkError, FitError
    from pdscale.planner.profile_fit.files import fitted_summary, write_profile
    from pdscale.planner.profile_fit.sweep import sweep_provenance

    status = 0 if record.failed is None else 2
    if not files:
        print("pdscale profile run: error: no run finished: no profile written", file=sys.stderr)
        return 2
    try:
        result, _ = _fit(files, s, name)
    except (BenchmarkError, FitError, ProfileError) as exc:
        print(f"pdscale profile run: error: the {len(files)} finished runs determine no "
              f"profile: {exc}", file=sys.stderr)
        return 2
    if record.failed is not None:
        print(f"pdscale profile run: the sweep stopped early; the profile is fitted from the "
              f"{len(files)} runs that finished (kept in {files[0].parent.parent})",
              file=sys.stderr)
    document = result.document
    document["provenance"]["fitted_by"] = "pdscale profile run"
    document["provenance"]["sweep"] = sweep_provenance(record)
    for warning in result.warnings:
        print(f"pdscale profile run: warning: {warning}", file=sys.stderr)
    text = write_profile(args.output, HEADER, document)
    print(fitted_summary(args.output, result))
    if args.configmap:
        status = max(status, write_configmap(args, s.namespace, text,
                                             complete=record.failed is None))
    return status


def write_configmap(args: argparse.Namespace, namespace: str | None, text: str, *,
                    complete: bool) -> int:
    from pdscale.planner.profile_fit.sweep import SweepError
    from pdscale.profile_sweep import profile_configmap
    from pdscale.render import dump

    try:
        manifest = profile_configmap(args.configmap, text, namespace=namespace,
                                     key=args.configmap_key)
    except SweepError as exc:
        print(f"pdscale profile run: error: --configmap: {exc}", file=sys.stderr)
        return 2
    path = args.configmap_output or args.output.with_name(args.output.stem + "-configmap.yaml")
    path.write_text(dump([manifest]), encoding="utf-8")
    print(f"wrote {path}: ConfigMap {args.configmap} (kubectl apply -f {path})")
    if args.apply_configmap and not complete:
        # a profile from part of the grid is written, never put in front of a running planner
        print(f"pdscale profile run: ConfigMap {args.configmap} not applied: the sweep did not "
              f"finish (apply {path} yourself if this profile will do)", file=sys.stderr)
    elif args.apply_configmap:
        return apply_configmap(manifest)
    return 0


def apply_configmap(manifest: dict[str, Any]) -> int:
    """Create the ConfigMap, or update one this command wrote before (its managed-by label);
    one of that name that is someone else's is left alone (exit 2)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config import ConfigException

    from pdscale.operator.clients.kube import api_client_from_environment
    from pdscale.profile_sweep import MANAGER

    meta = manifest["metadata"]
    name, namespace = meta["name"], meta.get("namespace")
    if not namespace:
        print("pdscale profile run: error: --apply-configmap: needs --namespace (or -f)",
              file=sys.stderr)
        return 2
    try:
        core = client.CoreV1Api(api_client_from_environment())
        try:
            existing = core.read_namespaced_config_map(name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = client.V1ConfigMap(api_version="v1", kind="ConfigMap", data=manifest["data"],
                                      metadata=client.V1ObjectMeta(name=name, namespace=namespace,
                                                                   labels=meta["labels"]))
            core.create_namespaced_config_map(namespace, body, field_manager=MANAGER)
        else:
            labels = (existing.metadata.labels if existing.metadata else None) or {}
            owner = labels.get("app.kubernetes.io/managed-by")
            if owner != MANAGER:
                print(f"pdscale profile run: error: ConfigMap {namespace}/{name} exists and is "
                      f"not one profile run wrote (managed-by {owner!r}): left alone",
                      file=sys.stderr)
                return 2
            core.patch_namespaced_config_map(name, namespace, {
                "metadata": {"labels": meta["labels"]}, "data": manifest["data"]},
                field_manager=MANAGER)
    except ConfigException as exc:
        print(f"pdscale profile run: error: --apply-configmap: {exc}", file=sys.stderr)
        return 2
    except ApiException as exc:
        print(f"pdscale profile run: error: ConfigMap {namespace}/{name}: the API server "
              f"answered HTTP {exc.status} {exc.reason}", file=sys.stderr)
        return 2
    print(f"applied ConfigMap {namespace}/{name}")
    return 0
