#!/usr/bin/env bash
# Install the package into a virtual environment: scripts/install_venv.sh VENV PYTHON SPEC
# (SPEC: '.[dev]' or '.'), always with -c constraints.txt (torch pinned to the local CPU wheel).
#
# uv installs the same pinned set several times faster than pip; it is fetched into the venv
# with pip and given pip's own configuration (index, extra indexes, find-links: `pip config
# list`, files and PIP_* variables alike), with pip's rule of taking the best version from any
# index. If uv cannot be fetched or fails, pip installs as before.
set -euo pipefail

venv=$1 python=$2 spec=$3
py=$venv/bin/python

test -x "$py" || "$python" -m venv "$venv"

uv_args=()
while IFS= read -r line; do
    key=${line%%=*}
    value=${line#*=}
    value=${value#\'}
    value=${value%\'}
    case $key in
    *.find-links) option=--find-links ;;
    *.extra-index-url) option=--extra-index-url ;;
    *.index-url) option=--index-url ;;
    *) continue ;;
    esac
    for item in $value; do
        uv_args+=("$option" "$item")
    done
done < <("$py" -m pip config list 2>/dev/null || true)

if "$py" -m pip install --quiet uv &&
    "$venv/bin/uv" pip install --quiet --python "$py" --index-strategy unsafe-best-match \
        ${uv_args[@]+"${uv_args[@]}"} -c constraints.txt -e "$spec"; then
    exit 0
fi
echo "== uv could not install the environment: installing with pip" >&2
"$py" -m pip install --quiet --upgrade pip
"$py" -m pip install -c constraints.txt -e "$spec"
