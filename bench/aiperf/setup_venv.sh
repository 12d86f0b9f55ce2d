#!/usr/bin/env bash
# Build a virtual environment holding aiperf 0.13.0, apart from pdscale's own: aiperf is not a
# pdscale dependency (it brings about 1 GB and pins its own stack), but `pdscale profile run`
# drives it and tests/planner/test_profile_{fit,run}_closed.py run it against simulated engines.
#
# Usage: bench/aiperf/setup_venv.sh [VENV_DIR]   (default $PDSCALE_CACHE/aiperf-venv,
#   PDSCALE_CACHE defaulting to ~/.cache/pdscale as for the control plane's builds)
# Prints nothing on stdout but the aiperf executable's path (for PDSCALE_AIPERF).
# Idempotent: a venv built from this script as it is now is kept (seconds); `make test` runs it
# so the closed-loop aiperf tests never skip there.
set -euo pipefail

venv_dir="${1:-${PDSCALE_CACHE:-$HOME/.cache/pdscale}/aiperf-venv}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python_bin="${PYTHON:-python3.11}"
export PYTHONSAFEPATH=1  # a checkout's operator/ must never shadow the standard library's
cd /

stamp="$venv_dir/.pdscale-setup"
want=$(sha256sum "$here/setup_venv.sh" | cut -c1-16)
if [ -x "$venv_dir/bin/aiperf" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "aiperf venv ready: $venv_dir (already built)" >&2
  echo "$venv_dir/bin/aiperf"
  exit 0
fi
echo "building the aiperf venv in $venv_dir (a few minutes, once)" >&2
# rebuild from scratch, but only ever remove a virtual environment
if [ -e "$venv_dir" ]; then
  [ -f "$venv_dir/pyvenv.cfg" ] || { echo "$venv_dir exists and is not a virtual environment" >&2; exit 1; }
  rm -rf "$venv_dir"
fi
"$python_bin" -m venv "$venv_dir"
"$venv_dir/bin/python" -m pip install --quiet "aiperf==0.13.0" >&2
"$venv_dir/bin/aiperf" --help > /dev/null
echo "$want" > "$stamp"
echo "aiperf venv ready: $venv_dir" >&2
echo "$venv_dir/bin/aiperf"
