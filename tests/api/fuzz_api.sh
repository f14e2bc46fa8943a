#!/usr/bin/env bash
# schemathesis (all phases, every check) against a real `quantd serve` on loopback: once with a
# fixed seed, once with a random one (printed, to replay). usage: fuzz_api.sh EXAMPLES [SEEDS...]
set -euo pipefail
examples=${1:-30}; shift || true
seeds=("${@:-1}")
[ "${#seeds[@]}" -gt 0 ] || seeds=(1)
root=$(cd "$(dirname "$0")/../.." && pwd)
quantd=${QUANTD:-$root/bin/quantd}
st=${ST:-$root/.venv/bin/st}
data=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$quantd" serve --listen "127.0.0.1:$port" --backend cpu --data-dir "$data" 2>"$data.log" &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -rf "$data" "$data.log"' EXIT
python3 - "$port" <<'PY'
import sys, time, urllib.request
for _ in range(200):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/healthz", timeout=1)
        break
    except OSError:
        time.sleep(0.05)
PY
rc=0
for seed in "${seeds[@]}"; do
  [ "$seed" = random ] && seed=$RANDOM$RANDOM
  echo "== schemathesis seed $seed, $examples examples per operation"
  "$st" --config-file "$root/tests/api/schemathesis.toml" run "$root/api/openapi.yaml" \
    --url "http://127.0.0.1:$port" --checks all --seed "$seed" -n "$examples" --workers 1 || rc=1
done
kill -TERM $pid
wait $pid || { echo "quantd serve did not exit cleanly"; rc=1; }
exit $rc
