dir=$1 name=$2 limit=$3 split=$4 gpus=$5 tool=$6 reps=$7; shift 7
case $dir in "~/"*) dir=$HOME/${dir#"~/"} ;; esac
command -v mpirun >/dev/null 2>&1 || { echo "mpirun not found on the launcher" >&2; exit 127; }
mkdir -p "$dir" && cat >"$dir/$name" || { echo "cannot write the hostfile $dir/$name" >&2; exit 1; }
echo "# preflight: tool=$tool gpus=$gpus repetitions=$reps"
sed '/^#/!s/^/# preflight: host /' "$dir/$name"
if [ -n "$split" ]; then export NCCL_TESTS_SPLIT="$split"; fi
rep=1
while [ "$rep" -le "$reps" ]; do
  start=$(date +%s)
  # Into a file, printed after: mpirun's ssh children run in process groups of their own, outlive
  # timeout's kill, and would otherwise hold this session's output open until they end.
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET timeout -k @KILL_AFTER@ "$limit" mpirun --hostfile "$dir/$name" "$@" \
    </dev/null >"$dir/$name.out" 2>&1
  code=$?
  cat "$dir/$name.out"
  echo "# preflight: repetition $rep exit=$code seconds=$(($(date +%s) - start))"
  rep=$((rep + 1))
done
exit 0
