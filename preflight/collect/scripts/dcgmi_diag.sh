# dcgmi-diag probe: sh -c SCRIPT sh LEVEL ASKED LIMIT (preflight/collect/dcgm.py)
level=$1
asked=$2
limit=$3
echo "# preflight: dcgmi-diag level=$level asked=$asked limit=$limit"
if ! command -v dcgmi >/dev/null 2>&1; then
  echo "dcgmi not found on PATH (DCGM is not installed)" >&2
  exit 127
fi
start=$(date +%s)
# A diag that hangs is a result: stop it at the level's limit (SIGTERM lets dcgmi stop the
# diagnostic on the host engine; SIGKILL follows) and say so in the closing line.
timeout -k @KILL_AFTER@ "$limit" dcgmi diag -r "$level" -j
rc=$?
end=$(date +%s)
echo
echo "# preflight: dcgmi-diag exit=$rc seconds=$((end - start))"
exit 0
