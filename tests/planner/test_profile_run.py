"""``pdscale profile run`` without aiperf: its grid, the early-stop rule (the coverage rule of
``profile fit``), aiperf's command line, the progress it prints, the ConfigMap and Job it
builds (pure), and the sweep itself driven by a stand-in aiperf (fake_aiperf.py) that writes
what a deployment running a known profile would give: stopped early where covered, a failed
run reported with its stderr and the finished runs kept and fitted."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
import yaml
from fake_aiperf import TRUTH, records_jsonl, simulate

from pdscale.main import main
from pdscale.operator.api.pdcluster import ProfileConfigMapRef
from pdscale.operator.loop.profile_source import configmap_source, profile_from_configmap
from pdscale.operator.reconciler.status import profile_status
from pdscale.planner.model import PerformanceModel, Slo
from pdscale.planner.profile import MAX_PROFILE_BYTES, load_profile
from pdscale.planner.profile_fit import Benchmark, DecodePoint, PrefillPoint, fit_profile
from pdscale.planner.profile_fit.sweep import (
    DECODE,
    MIN_RUNS,
    PREFILL,
    Grid,
    Run,
    SweepError,
    Target,
    clock_text,
    grid_problems,
    progress_done,
    progress_skip,
    progress_start,
    row_shortfall,
    rows,
    stops_after,
)
from pdscale.profile_sweep import (
    AIPERF_ENV,
    JobSettings,
    aiperf_command,
    aiperf_environment,
    find_aiperf,
    pdcluster_target,
    profile_configmap,
    sweep_arguments,
    sweep_job,
)

FAKE = Path(__file__).with_name("fake_aiperf.py")
SLO = Slo(ttft_seconds=2.0, tpot_seconds=0.1)
MODEL = PerformanceModel(TRUTH)
PDCLUSTER = {
    "apiVersion": "pdscale.io/v1alpha1", "kind": "PDCluster",
    "metadata": {"name": "llama", "namespace": "team-a"},
    "spec": {"model": {"servedName": "llama-3", "path": "meta-llama/Llama-3.1-8B-Instruct",
                       "maxContextLengthTokens": 8192},
             "engine": {"kind": "SGLang", "image": "img"}, "router": {"image": "router-img"},
             "slo": {"ttftMilliseconds": 1500, "tpotMilliseconds": 40}},
}


# -- the grid ---------------------------------------------------------------------------------

def test_the_default_grid_is_prefill_alone_then_concurrency_per_context():
    plan = rows(Grid())
    assert [r.stage for r in plan] == [PREFILL, DECODE, DECODE, DECODE]
    prefill = plan[0].runs
    assert [r.input_tokens for r in prefill] == [256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
    assert {(r.concurrency, r.requests, r.output_tokens) for r in prefill} == {(1, 8, 32)}
    assert [row.runs[0].input_tokens for row in plan[1:]] == [256, 2048, 8192]
    assert [(r.concurrency, r.requests) for r in plan[1].runs][:3] == [(2, 6), (8, 24), (16, 48)]
    assert plan[1].runs[0].name == "decode-isl256-c2"


def test_runs_longer_than_the_models_context_are_left_out():
    plan = rows(Grid(), max_context_tokens=8192)
    assert max(r.input_tokens for r in plan[0].runs) == 4096  # 8192 + 32 output tokens is over
    assert [row.runs[0].input_tokens for row in plan[1:]] == [256, 2048]
    with pytest.raises(SweepError, match="no run fits the model's context of 100 tokens"):
        rows(Grid(), max_context_tokens=100)


@pytest.mark.parametrize("grid, flag", [
    (Grid(prefill_lengths=(100, 0)), "--prefill-lengths: every value must be a positive"),
    (Grid(decode_concurrencies=(2, 2)), "--decode-concurrencies: a value is repeated"),
    (Grid(prefill_requests=0), "--prefill-requests: must be at least 1"),
    (Grid(decode_output_tokens=1), "--decode-output-tokens: must be at least 2"),
    (Grid(prefill_lengths=(1000,)), "--prefill-lengths: the prefill fit needs at least two"),
])
def test_a_bad_grid_is_refused_naming_its_flag(grid, flag):
    assert any(p.startswith(flag) for p in grid_problems(grid))
    with pytest.raises(SweepError, match=flag.split(":")[0]):
        rows(grid)


def test_aiperf_gets_fixed_lengths_a_fixed_seed_and_the_users_flags_last():
    run = Run(DECODE, 2048, 128, 16, 48)
    cmd = aiperf_command("/v/bin/aiperf", Target("http://r:30000", "m", "org/m"), run, "/w/03",
                         ["--request-timeout-seconds", "600"])
    assert cmd == ["/v/bin/aiperf", "profile", "--url", "http://r:30000", "--endpoint-type",
                   "completions", "--streaming", "--model", "m", "--tokenizer", "org/m",
                   "--isl", "2048", "--isl-stddev", "0", "--osl", "128", "--concurrency", "16",
                   "--request-count", "48", "--random-seed", "1", "--extra-inputs",
                   "ignore_eos:true", "--ui-type", "none", "--artifact-dir", "/w/03",
                   "--request-timeout-seconds", "600"]
    assert "--tokenizer" not in aiperf_command("a", Target("u", "m"), run, "d")


def test_hf_hub_offline_is_dropped_for_a_local_tokenizer_only():
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/bin"}
    assert aiperf_environment(env, local_tokenizer=True) == {"PATH": "/bin"}
    assert aiperf_environment(env, local_tokenizer=False) == env
    assert aiperf_environment(env, local_tokenizer=False, scratch_dir="/w/03/tmp") == {
        **env, "TMPDIR": "/w/03/tmp"}


def test_a_missing_aiperf_is_refused_naming_the_flag_and_the_variable():
    with pytest.raises(SweepError) as err:
        find_aiperf(None, {}, lambda name: None)
    assert "--aiperf PATH" in str(err.value) and AIPERF_ENV in str(err.value)
    assert "aiperf==0.13.0" in str(err.value)
    with pytest.raises(SweepError, match="--aiperf /nope: not an executable"):
        find_aiperf("/nope", {}, lambda name: None)
    with pytest.raises(SweepError, match=f"{AIPERF_ENV}=/gone: not an executable"):
        find_aiperf(None, {AIPERF_ENV: "/gone"}, lambda name: None)
    found = {"/v/aiperf": "/v/aiperf", "aiperf": "/usr/bin/aiperf"}.get
    assert find_aiperf(None, {AIPERF_ENV: "/v/aiperf"}, found) == "/v/aiperf"
    assert find_aiperf(None, {}, found) == "/usr/bin/aiperf"


# -- early stop: the coverage rule of profile fit -----------------------------------------------

def _benchmark(prefill=(), decode=()) -> Benchmark:
    return Benchmark("x.jsonl", "aiperf", tuple(prefill), tuple(decode),
                     ttft_includes_kv_transfer=False)


def test_the_prefill_row_stops_once_a_prompt_takes_80_percent_of_the_ttft_target():
    row = rows(Grid(prefill_lengths=(100, 1000, 2000, 3000, 4000, 6000)))[0]
    done = [PrefillPoint(n, MODEL.prefill_seconds(n)) for n in (100, 1000, 2000, 3000)]
    short = row_shortfall(row, TRUTH, [_benchmark(done)], TRUTH, SLO)
    assert short is not None and "longest prompt measured (3000 tokens) took 1.175 s" in short
    assert not stops_after(row, 4, short)
    done.append(PrefillPoint(4000, MODEL.prefill_seconds(4000)))  # 1.72 s >= 1.6 s
    assert row_shortfall(row, TRUTH, [_benchmark(done)], TRUTH, SLO) is None
    assert stops_after(row, 5, None)
    assert not stops_after(row, 6, None)  # nothing left to skip
    assert not stops_after(row, MIN_RUNS[PREFILL] - 1, None)  # the curvature needs 3 lengths


def test_a_decode_row_stops_once_its_batch_reaches_80_percent_of_the_batch_at_the_tpot_target():
    row = rows(Grid(decode_contexts=(1500,), decode_concurrencies=(2, 8, 24, 48),
                    decode_output_tokens=64))[1]
    context = 1532
    at_slo = MODEL.decode_batch_at_slo(SLO.tpot_seconds, context)
    assert at_slo == 15

    def points(*batches):
        return [_benchmark(decode=[DecodePoint(b, context, MODEL.tpot_seconds(b, context))
                                   for b in batches])]

    short = row_shortfall(row, TRUTH, points(2, 8), TRUTH, SLO)
    assert short is not None and "runs 15 sequences at 100 ms" in short and "reach 8.0" in short
    assert row_shortfall(row, TRUTH, points(2, 8, 13), TRUTH, SLO) is None  # 13 >= 0.8 x 15
    assert stops_after(row, 3, None) and not stops_after(row, 1, None)


# -- progress -------------------------------------------------------------------------------------

def test_progress_names_the_run_its_place_and_the_time():
    run = Run(PREFILL, 2048, 8, 1, 6)
    assert progress_start(3, 14, run, 75) == (
        "[3/14 1:15] prefill 2048 tokens in, 8 out, concurrency 1, 6 requests ...")
    assert progress_done(3, 14, run, 12.34, 87.6, None) == (
        "[3/14 1:28] prefill-isl2048-c1 done in 12.3 s; SLO region covered")
    assert progress_done(3, 14, run, 1, 2, "no prefill near").endswith("not covered yet: no prefill near")
    assert clock_text(3725) == "1:02:05"
    plan = rows(Grid(prefill_lengths=(100, 200, 300, 400, 500), decode_concurrencies=(2, 8, 24)))
    assert progress_skip(plan[0], plan[0].runs[3:]) == (
        "prefill: SLO region covered, early stop: skipping tokens 400, 500")
    assert progress_skip(plan[1], plan[1].runs[2:]) == (
        "decode at 256 tokens: SLO region covered, early stop: skipping concurrency 24")


# -- the ConfigMap and the Job ----------------------------------------------------------------

def _fitted_text() -> str:
    prefill = [PrefillPoint(n, MODEL.prefill_seconds(n)) for n in (200, 1000, 3000)]
    decode = [DecodePoint(b, 1000, MODEL.tpot_seconds(b, 1000)) for b in (1, 4, 16)]
    doc = fit_profile([_benchmark(prefill, decode)], TRUTH, name="mine", fitted_at="-").document
    doc["provenance"]["fitted_by"] = "pdscale profile run"
    return yaml.safe_dump(doc, sort_keys=False)


def test_the_configmap_is_one_the_operator_reads_with_its_provenance_in_status():
    manifest = profile_configmap("my-profile", _fitted_text(), namespace="team-a")
    assert manifest["metadata"]["namespace"] == "team-a"
    assert list(manifest["data"]) == ["profile.yaml"]
    assert manifest["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "pdscale-profile-run"
    ref = ProfileConfigMapRef(name="my-profile")
    profile = profile_from_configmap(manifest, ref, "team-a")
    status = profile_status(profile, configmap_source(ref, "9"), None)
    assert status["provenance"]["fittedBy"] == "pdscale profile run"
    other = profile_configmap("p", _fitted_text(), namespace=None, key="fitted.yaml")
    assert "namespace" not in other["metadata"] and list(other["data"]) == ["fitted.yaml"]


def test_a_configmap_over_the_size_limit_or_badly_named_is_refused():
    with pytest.raises(SweepError, match=f"over the {MAX_PROFILE_BYTES // 1024} KiB"):
        profile_configmap("p", _fitted_text() + "#" * MAX_PROFILE_BYTES, namespace="a")
    with pytest.raises(SweepError, match="--configmap 'My_Profile': not a ConfigMap name"):
        profile_configmap("My_Profile", _fitted_text(), namespace="a")


def test_a_pdcluster_gives_the_router_service_the_model_the_slo_and_the_context():
    cluster = pdcluster_target(PDCLUSTER, None, None)
    assert cluster.target == Target("http://llama-router.team-a.svc:30000", "llama-3",
                                    "meta-llama/Llama-3.1-8B-Instruct")
    assert (cluster.ttft_seconds, cluster.tpot_seconds, cluster.max_context_tokens) == (1.5, 0.04, 8192)
    with_weights = yaml.safe_load(yaml.safe_dump(PDCLUSTER))
    with_weights["spec"]["model"]["weights"] = {"pvc": {"claimName": "w"}, "mountPath": "/models"}
    with_weights["spec"]["model"]["path"] = "/models/llama"
    with pytest.raises(SweepError, match="--tokenizer: the PDCluster loads its model from a volume"):
        pdcluster_target(with_weights, None, None)
    with pytest.raises(SweepError, match=r"-f: not a pdscale\.io PDCluster"):
        pdcluster_target({"kind": "Deployment"}, None, None)


def _job() -> list[dict]:
    cluster = pdcluster_target(PDCLUSTER, None, None)
    args = sweep_arguments(cluster.target, Grid(), ttft_seconds=1.5, tpot_seconds=0.04,
                           base="demo-sim", max_context_tokens=8192)
    return sweep_job(cluster, JobSettings(image="reg/pdscale-aiperf:1", configmap="llama-profile"),
                     args)


def test_the_job_runs_the_same_sweep_against_the_router_service_and_writes_the_configmap():
    account, role, binding, job = _job()
    assert [m["kind"] for m in (account, role, binding, job)] == [
        "ServiceAccount", "Role", "RoleBinding", "Job"]
    assert {m["metadata"]["namespace"] for m in (account, role, binding, job)} == {"team-a"}
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    command = container["command"]
    assert command[:3] == ["pdscale", "profile", "run"]
    assert command[command.index("--url") + 1] == "http://llama-router.team-a.svc:30000"
    assert command[command.index("--configmap") + 1] == "llama-profile"
    assert "--apply-configmap" in command
    assert command[command.index("--prefill-lengths") + 1] == "256,512,1024,2048,4096,8192,16384,32768"
    assert job["spec"]["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": "team-a"}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_the_jobs_pod_runs_as_the_operators_own_without_privilege():
    *_, job = _job()
    pod = job["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                      "seccompProfile": {"type": "RuntimeDefault"}}
    (container,) = pod["containers"]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "privileged": False,
                                            "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod)
    assert all("emptyDir" in v for v in pod["volumes"])
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/work", "/tmp"}


def test_the_jobs_role_writes_one_configmap_and_nothing_else():
    _, role, _, _ = _job()
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["llama-profile"],
         "verbs": ["get", "patch"]},
    ]


def test_render_job_prints_the_manifests_and_needs_an_image(tmp_path, capsys):
    spec = tmp_path / "pdc.yaml"
    spec.write_text(yaml.safe_dump(PDCLUSTER))
    assert main(["profile", "run", "-f", str(spec), "--render-job", "--configmap", "p"]) == 2
    assert "--job-image: required" in capsys.readouterr().err
    assert main(["profile", "run", "-f", str(spec), "--render-job", "--configmap", "p",
                 "--job-image", "reg/x:1"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    local = tmp_path / "base.yaml"
    local.write_text(yaml.safe_dump(TRUTH.model_dump(mode="json")))
    assert main(["profile", "run", "-f", str(spec), "--render-job", "--configmap", "p",
                 "--job-image", "reg/x:1", "--base", str(local)]) == 2
    assert "the Job's pod cannot read a file of this machine" in capsys.readouterr().err
    assert [d["kind"] for d in docs] == ["ServiceAccount", "Role", "RoleBinding", "Job"]
    command = docs[-1]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--slo-ttft") + 1] == "1.5"
    assert command[command.index("--max-context-tokens") + 1] == "8192"  # the model's


# -- the sweep, with a stand-in aiperf ----------------------------------------------------------

@pytest.fixture
def fake_aiperf(tmp_path: Path) -> Path:
    script = tmp_path / "aiperf"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def _sweep(tmp_path: Path, aiperf: Path, *extra: str) -> list[str]:
    truth = tmp_path / "truth.yaml"
    truth.write_text(yaml.safe_dump(TRUTH.model_dump(mode="json")))
    return ["profile", "run", "--url", "http://router:30000", "--model", "m",
            "--aiperf", str(aiperf), "--base", str(truth), "--slo-ttft", "2", "--slo-tpot", "0.1",
            "--prefill-lengths", "100,1000,2000,3000,4000,6000", "--prefill-requests", "3",
            "--decode-contexts", "100,1500", "--decode-concurrencies", "2,8,24,48",
            "--decode-output-tokens", "64", "-o", str(tmp_path / "out.yaml"), *extra]


@pytest.mark.slow  # 20-50 s on two busy cores: out of make test-fast
def test_a_sweep_stops_each_row_where_covered_and_fits_the_truth(tmp_path, fake_aiperf, capsys):
    code = main(_sweep(tmp_path, fake_aiperf, "--configmap", "p", "--namespace", "team-a"))
    err = capsys.readouterr().err
    assert code == 0, err
    fitted = load_profile(tmp_path / "out.yaml")
    sweep = fitted.provenance["sweep"]
    names = [r["name"] for r in sweep["runs"]]
    # prefill: 4000 tokens take 1.72 s of the 2 s target; decode at 1532 tokens of context:
    # 15 sequences at 100 ms, covered by 24; at 132: 35, which only 48 covers
    assert names == ["prefill-isl100-c1", "prefill-isl1000-c1", "prefill-isl2000-c1",
                     "prefill-isl3000-c1", "prefill-isl4000-c1", "decode-isl100-c2",
                     "decode-isl100-c8", "decode-isl100-c24", "decode-isl100-c48",
                     "decode-isl1500-c2", "decode-isl1500-c8", "decode-isl1500-c24"]
    assert sweep["early_stop"] == [
        "prefill: SLO region covered, early stop: skipping tokens 6000",
        "decode at 1500 tokens: SLO region covered, early stop: skipping concurrency 48"]
    assert fitted.provenance["fitted_by"] == "pdscale profile run"
    assert fitted.provenance["warnings"] == []
    assert fitted.prefill.tokens_per_second == pytest.approx(4000, rel=0.01)
    assert fitted.decode.per_context_token_seconds == pytest.approx(2e-6, rel=0.01)
    assert "[1/14 " in err and "[6/13 " in err  # the count shrinks as a row stops early
    assert (tmp_path / "out-runs" / "05-prefill-isl4000-c1" / "profile_export.jsonl").is_file()
    # aiperf's temp dir was each run's own, and is gone with what aiperf left in it
    scratch = {(run_dir / "tmpdir.txt").read_text() for run_dir in (tmp_path / "out-runs").iterdir()}
    assert len(scratch) == len(names)
    assert all(Path(d).name.startswith("pdscale-aiperf-") and not Path(d).exists() for d in scratch)
    manifest = yaml.safe_load((tmp_path / "out-configmap.yaml").read_text())
    assert profile_from_configmap(manifest, ProfileConfigMapRef(name="p"), "team-a") == fitted


@pytest.mark.slow  # 20-50 s on two busy cores: out of make test-fast
def test_a_failed_run_stops_the_sweep_with_its_stderr_and_keeps_what_finished(
        tmp_path, fake_aiperf, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_AIPERF_FAIL_AT_ISL", "1500")
    monkeypatch.setattr("pdscale.profile_run.apply_configmap", lambda manifest: pytest.fail(
        "a profile from part of the grid went to the cluster"))
    assert main(_sweep(tmp_path, fake_aiperf, "--configmap", "p", "--namespace", "team-a",
                       "--apply-configmap")) == 2
    err = capsys.readouterr().err
    assert "ConfigMap p not applied: the sweep did not finish" in err
    assert (tmp_path / "out-configmap.yaml").is_file()
    assert "[10/13] decode-isl1500-c2 FAILED: aiperf exited 1" in err
    assert "aiperf: error: connection refused" in err
    assert "the profile is fitted from the 9 runs that finished" in err
    fitted = load_profile(tmp_path / "out.yaml")
    assert fitted.provenance["sweep"]["stopped"].startswith("run 10 (decode-isl1500-c2) failed")
    assert [r["status"] for r in fitted.provenance["sweep"]["runs"]][-2:] == ["done", "failed"]
    kept = tmp_path / "out-runs" / "10-decode-isl1500-c2"
    assert "connection refused" in (kept / "aiperf.stderr.log").read_text()


def test_a_sweep_that_failed_before_anything_finished_writes_nothing(tmp_path, fake_aiperf,
                                                                      capsys, monkeypatch):
    monkeypatch.setenv("FAKE_AIPERF_FAIL_AT_ISL", "100")
    assert main(_sweep(tmp_path, fake_aiperf)) == 2
    assert "no run finished: no profile written" in capsys.readouterr().err
    assert not (tmp_path / "out.yaml").exists()


def test_the_sweep_refuses_a_missing_aiperf_a_used_workdir_and_a_missing_url(
        tmp_path, fake_aiperf, capsys, monkeypatch):
    monkeypatch.delenv(AIPERF_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    args = _sweep(tmp_path, fake_aiperf)
    no_aiperf = args[:args.index("--aiperf")] + args[args.index("--aiperf") + 2:]
    assert main(no_aiperf) == 2
    assert "aiperf not found: pass --aiperf PATH or set PDSCALE_AIPERF" in capsys.readouterr().err
    (tmp_path / "out-runs").mkdir()
    (tmp_path / "out-runs" / "old").write_text("")
    assert main(args) == 2
    assert "--workdir" in capsys.readouterr().err
    assert main(["profile", "run", "--model", "m", "-o", str(tmp_path / "x.yaml")]) == 2
    assert "--url: required" in capsys.readouterr().err


def test_the_stand_in_runs_what_it_is_asked():
    rows_ = simulate(1000, 64, 8, 24)
    assert len(rows_) == 24 and {r[0] for r in rows_} == {1000}
    assert records_jsonl(rows_[:1]).count("\n") == 1
    assert os.access(FAKE, os.R_OK)
