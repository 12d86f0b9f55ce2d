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
# Usage: bench/dynamo/setup_venv.sh [VENV_DIR]   (default $PDSCALE_CACHE/dynamo-venv,
#   PDSCALE_CACHE defaulting to ~/.cache/pdscale as for the control plane's builds)
# Idempotent: a venv built from this script, constraints.txt and the placeholder as they are
# now is kept (seconds); `make test` runs it so the real-Dynamo tests never skip there.
set -euo pipefail

venv_dir="${1:-${PDSCALE_CACHE:-$HOME/.cache/pdscale}/dynamo-venv}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python_bin="${PYTHON:-python3.11}"
# `python -m` puts the working directory first on sys.path; run from a neutral place so a
# checkout's folders (operator/ shadows the stdlib module) cannot be imported by accident.
export PYTHONSAFEPATH=1
cd /

stamp="$venv_dir/.pdscale-setup"
want=$(find "$here/setup_venv.sh" "$here/constraints.txt" "$here/aisimulate_core" -type f \
  -not -path '*/__pycache__/*' | sort | xargs cat | sha256sum | cut -c1-16)
if [ -x "$venv_dir/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "dynamo venv ready: $venv_dir (already built)"
  exit 0
fi
echo "building the Dynamo venv in $venv_dir (about a minute)" >&2
# rebuild from scratch, but only ever remove a virtual environment
if [ -e "$venv_dir" ]; then
  [ -f "$venv_dir/pyvenv.cfg" ] || { echo "$venv_dir exists and is not a virtual environment" >&2; exit 1; }
  rm -rf "$venv_dir"
fi
"$python_bin" -m venv "$venv_dir"
pip=("$venv_dir/bin/python" -m pip install --quiet -c "$here/constraints.txt")

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
echo "$want" > "$stamp"
echo "dynamo venv ready: $venv_dir"
