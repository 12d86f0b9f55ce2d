#!/usr/bin/env bash
# Build a virtual environment holding NVIDIA Dynamo 1.6.1's planner, apart from pdscale's own:
# ai-dynamo pins kubernetes<33 and pydantic<=2.13.5, which clash with pdscale's dependencies.
#
# Why --no-deps: ai-dynamo depends on `aisimulate`, a stub whose install downloads the real
# wheel from NVIDIA's own index, which this kind of machine cannot reach. So the two dynamo
# wheels go in without dependencies, the dependencies are listed by hand below, and a
# placeholder `aisimulate_core` (bench/dynamo/aisimulate_core, our own few lines, raising
# when used) stands in for the AI Configurator estimator that perf_model imports at module
# level. Consequence: Dynamo's AIC-estimator mode is not available; its profile
# interpolation and forward-pass regression are.
#
# Usage: bench/dynamo/setup_venv.sh [VENV_DIR]   (default ~/.cache/pdscale/dynamo-venv)
set -euo pipefail

venv_dir="${1:-$HOME/.cache/pdscale/dynamo-venv}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python_bin="${PYTHON:-python3.11}"
# `python -m` puts the working directory first on sys.path; run from a neutral place so a
# checkout's folders (operator/ shadows the stdlib module) cannot be imported by accident.
export PYTHONSAFEPATH=1
cd /

"$python_bin" -m venv "$venv_dir"
pip=("$venv_dir/bin/python" -m pip install --quiet)

"${pip[@]}" --no-deps "ai-dynamo==1.6.1" "ai-dynamo-runtime==1.6.1"
# The dependency list dynamo.planner needs (docs/dynamo-baseline.md says which ones the
# offline adapter really touches).
"${pip[@]}" "kubernetes>=32.0.1,<33" "pydantic<=2.13.5" msgspec numpy scikit-learn \
    prometheus-client prometheus-api-client aiohttp pyzmq redis tqdm zstandard uvloop \
    plotly pandas pmdarima filterpy prophet
# The placeholder goes in as an ordinary (non-editable) package so the venv does not
# depend on where this checkout lives; built from a copy so no build files land in it.
build_dir="$(mktemp -d)"
trap 'rm -rf "$build_dir"' EXIT
cp -r "$here/aisimulate_core" "$build_dir/"
"${pip[@]}" --no-deps --force-reinstall "$build_dir/aisimulate_core"

"$venv_dir/bin/python" -c "import dynamo.planner.offline.replay_adapter as m; print('ok', m.__file__)"
echo "dynamo venv ready: $venv_dir"
