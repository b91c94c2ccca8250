reps=$1 max=$2 limit=$3 dir=$4 cooldown=$5 fallback=$6 list_limit=${7:-60} import_limit=${8:-120}
command -v nvidia-smi >/dev/null 2>&1 || { echo "nvidia-smi not found: cannot count the GPUs" >&2; exit 127; }
gpus=$(timeout -k 5 "$list_limit" nvidia-smi -L 2>/dev/null)
code=$?
ngpu=$(printf '%s\n' "$gpus" | grep -c '^GPU ')
if [ "$code" = 124 ] || [ "$code" = 137 ]; then
  echo "nvidia-smi -L did not answer within $list_limit s: cannot count the GPUs" >&2; exit 1
fi
[ "$ngpu" -gt 0 ] || { echo "nvidia-smi -L lists no GPU" >&2; exit 1; }
if [ -n "$dir" ]; then bin=$dir/all_reduce_perf; [ -x "$bin" ] || bin=
else bin=$(command -v all_reduce_perf) || bin=
fi
if [ -n "$bin" ]; then
  tool=$bin; set -- "$bin"
elif timeout -k 5 "$import_limit" python3 -c 'import torch' >/dev/null 2>&1; then
  tool=torch-fallback; set -- python3 -u -c "$fallback"
else
  echo "all_reduce_perf not found (in ${dir:-PATH}) and python3 cannot import torch" >&2; exit 127
fi
echo "# preflight: tool=$tool gpus=$ngpu repetitions=$reps"
k=1
while [ "$k" -le "$reps" ]; do
  [ "$k" -gt 1 ] && sleep "$cooldown"
  start=$(date +%s)
  NCCL_DEBUG=WARN timeout -k @KILL_AFTER@ "$limit" "$@" -b 8 -e "$max" -f 2 -g "$ngpu" -c 1 -n 20 </dev/null 2>&1
  code=$?
  echo "# preflight: repetition $k exit=$code seconds=$(($(date +%s) - start))"
  k=$((k + 1))
done
exit 0
