"""Performance profiles from the user's own engines. ``fit`` reads the results of a benchmark
client (aiperf, GuideLLM, inference-perf, SGLang bench_serving, vllm bench serve) or Dynamo's profiler arrays, fits the
profile's parametric terms and writes a profile YAML with its provenance. Examples:

    pdscale profile fit prefill/raw_data.npz decode/raw_data.npz -o mine.yaml
    pdscale profile fit c1/profile_export.jsonl c8/profile_export.jsonl --base demo-sim -o mine.yaml

``export`` writes the profile a PDCluster plans with (shipped or from its ConfigMap), with the
online calibration's time factors applied, read from the cluster ($KUBECONFIG):

    pdscale profile export NAMESPACE/NAME -o calibrated.yaml

``run`` measures a PD deployment with aiperf and fits what it measured
(:mod:`pdscale.profile_run`):

    pdscale profile run --url http://localhost:30000 --model my-model -o mine.yaml

Exit status 2 when a file cannot be read or the points cannot determine a profile (the message
names the file, the line and the field).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

from pdscale import profile_run

HELP = "fit a performance profile to benchmark results, or measure one with aiperf"
#: the readers' names (pdscale.planner.profile_fit.READERS, checked by a test): listed here so
#: that building the command line does not import scipy
FORMATS = ("aiperf", "dynamo-npz", "guidellm", "inference-perf", "sglang", "vllm")

HEADER = """\
# Fitted by `pdscale profile fit` from the benchmark results listed under provenance.sources.
# Terms under provenance.terms with identified: false were not determined by the points (kept
# from the base profile, or written flat); provenance.residuals says how far the model's form is
# from the points it was fitted to (relative to each measured value).
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    actions = parser.add_subparsers(dest="profile_command", required=True, metavar="ACTION")
    fit = actions.add_parser("fit", help="fit a profile to benchmark results",
                             description="Fit the profile's prefill and decode terms to benchmark "
                                         "results; the other fields come from --base.")
    fit.add_argument("files", nargs="+", metavar="FILE", type=Path,
                     help="benchmark results: Dynamo profiler .npz, aiperf profile_export.jsonl, "
                          "GuideLLM benchmarks.json, inference-perf per_request_lifecycle_metrics.json, "
                          "SGLang bench_serving --output-details JSONL, vllm bench serve "
                          "--save-detailed JSON")
    fit.add_argument("-o", "--output", required=True, type=Path, help="profile YAML to write")
    fit.add_argument("--base", help="profile giving the fields the points do not determine "
                                    "(shipped name or YAML; default: the shipped default)")
    fit.add_argument("--name", help="the fitted profile's name (default: the output file's stem)")
    fit.add_argument("--format", choices=FORMATS, help="reader for every FILE "
                                                               "(default: detected per file)")
    fit.add_argument("--kv-transfer-in-ttft", action=argparse.BooleanOptionalAction, default=None,
                     help="the measured TTFTs include the PD KV hand-off, taken off (by the base's "
                          "kv_transfer) before the prefill fit (default: yes for benchmark "
                          "clients, no for Dynamo's profiler)")
    fit.add_argument("--slo-ttft", type=float, default=2.0,
                     help="TTFT target, seconds: warn when the points stop well short of it")
    fit.add_argument("--slo-tpot", type=float, default=0.05,
                     help="TPOT target, seconds: warn when no decode batch reaches near it")
    export = actions.add_parser(
        "export", help="write the profile a PDCluster plans with, calibrated",
        description="Write the profile a PDCluster plans with (shipped, or from "
                    "spec.planner.profileConfigMap) as YAML, with the online calibration's time "
                    "factors applied to prefill overhead and tokens/s and to the decode step, "
                    "per-sequence and per-context terms (provenance.calibration lists them and "
                    "the headrooms, which are not terms). Reads the cluster through $KUBECONFIG.")
    export.add_argument("pdcluster", metavar="NAMESPACE/NAME", help="the PDCluster")
    export.add_argument("-o", "--output", required=True, type=Path, help="profile YAML to write")
    profile_run.add_arguments(actions)


def run(args: argparse.Namespace) -> int:
    if args.profile_command == "fit":
        return fit(args)
    if args.profile_command == "export":
        return export(args)
    if args.profile_command == "run":
        return profile_run.run(args)
    return 2


def export(args: argparse.Namespace) -> int:
    import time

    import yaml
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config import ConfigException

    from pdscale.operator.api.clock import now_rfc3339
    from pdscale.operator.clients.kube import Kube, api_client_from_environment
    from pdscale.operator.loop.profile_source import export_profile
    from pdscale.planner.profile import ProfileError, load_profile

    def refuse(message: str) -> int:
        print(f"pdscale profile export: error: {message}", file=sys.stderr)
        return 2

    namespace, _, name = args.pdcluster.partition("/")
    if not namespace or not name or "/" in name:
        return refuse(f"{args.pdcluster!r}: want NAMESPACE/NAME")
    try:
        kube = Kube(api_client_from_environment())
        profile = export_profile(kube, namespace, name, now=time.time(), exported_at=now_rfc3339())
    except (ProfileError, ConfigException) as exc:
        return refuse(str(exc))
    except ApiException as exc:
        return refuse(f"the API server answered HTTP {exc.status} {exc.reason}")
    cal = (profile.provenance or {})["calibration"]
    header = (f"# Exported by `pdscale profile export {namespace}/{name}` from "
              f"{cal['exported_from']} at {cal['exported_at']}: the terms under "
              f"provenance.calibration.applied_to carry the online calibration's factors.\n")
    args.output.write_text(header + yaml.safe_dump(profile.model_dump(mode="json"), sort_keys=False,
                                                   width=100), encoding="utf-8")
    load_profile(args.output)  # what we write must load where profiles are read
    print(f"wrote {args.output}: profile {profile.name!r} from {cal['exported_from']}; prefill "
          f"time x{cal['prefill_factor']:.3g}, decode time x{cal['decode_factor']:.3g}, headroom "
          f"prefill x{cal['prefill_headroom']:.3g} decode x{cal['decode_headroom']:.3g} (not "
          f"applied)")
    return 0


def fit(args: argparse.Namespace) -> int:
    from pdscale.planner.model import Slo
    from pdscale.planner.profile import ProfileError, load_profile
    from pdscale.planner.profile_fit import BenchmarkError, FitError
    from pdscale.planner.profile_fit.files import fit_files, fitted_summary, write_profile

    def refuse(message: str) -> int:
        print(f"pdscale profile fit: error: {message}", file=sys.stderr)
        return 2

    try:
        base = load_profile(args.base)
    except ProfileError as exc:
        return refuse(str(exc))
    try:
        result = fit_files(args.files, base, name=args.name or args.output.stem,
                           base_name=args.base, fmt=args.format,
                           slo=Slo(ttft_seconds=args.slo_ttft, tpot_seconds=args.slo_tpot),
                           kv_transfer_in_ttft=args.kv_transfer_in_ttft,
                           fitted_at=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    except (BenchmarkError, FitError, ProfileError) as exc:
        return refuse(str(exc))
    for warning in result.warnings:
        print(f"pdscale profile fit: warning: {warning}", file=sys.stderr)
    write_profile(args.output, HEADER, result.document)
    print(fitted_summary(args.output, result))
    return 0
