# dcgmi-health probe: sh -c SCRIPT (preflight/collect/dcgm.py)
if ! command -v dcgmi >/dev/null 2>&1; then
  echo "dcgmi not found on PATH (DCGM is not installed)" >&2
  exit 127
fi
# Watch every subsystem (watches stay on in the host engine after dcgmi exits), then ask what
# the retained samples show. Each step's exit code follows it; dcgmi's own words say why.
dcgmi health -s a
echo "# preflight: dcgmi-health set exit=$?"
dcgmi health -c -j
echo "# preflight: dcgmi-health check exit=$?"
exit 0
