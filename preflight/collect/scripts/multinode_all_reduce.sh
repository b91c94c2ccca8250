dir=$1 name=$2 limit=$3 split=$4 np=$5 gpus=$6 max=$7 bin=$8
case $dir in "~/"*) dir=$HOME/${dir#"~/"} ;; esac
command -v mpirun >/dev/null 2>&1 || { echo "mpirun not found on the launcher" >&2; exit 127; }
mkdir -p "$dir" && cat >"$dir/$name" || { echo "cannot write the hostfile $dir/$name" >&2; exit 1; }
echo "# preflight: tool=mpirun gpus=$gpus repetitions=1"
sed 's/^/# preflight: host /' "$dir/$name"
if [ -n "$split" ]; then export NCCL_TESTS_SPLIT="$split"; set -- -x NCCL_TESTS_SPLIT; else set --; fi
start=$(date +%s)
NCCL_DEBUG=WARN timeout -k @KILL_AFTER@ "$limit" mpirun --hostfile "$dir/$name" -np "$np" --tag-output \
  -x NCCL_DEBUG "$@" "$bin" -b 8 -e "$max" -f 2 -g 1 -c 1 </dev/null 2>&1
code=$?
echo "# preflight: repetition 1 exit=$code seconds=$(($(date +%s) - start))"
exit 0
