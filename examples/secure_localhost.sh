#!/usr/bin/env bash
# The README's secure walk-through ("A real deployment on localhost") in one go, timed: keys and
# certificates, a SuperLink with TLS and SuperNode authentication, the two nodes' keys
# registered, two SuperNodes that run only the approved example app, and one run of
# `flwr run`. Run it from the repository root after `make install`:
#
#     bash examples/secure_localhost.sh [MODEL]        # MODEL: gmm (default), glm, hm2, ...
#
# Everything it writes goes to a fresh folder under ${TMPDIR:-/tmp}; it stops what it started.
set -euo pipefail
MODEL=${1:-gmm}
ROOT=$(pwd)
. "$ROOT/.venv/bin/activate"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fedstats-walkthrough.XXXXXX")
cd "$WORK"
PIDS=()
stop() { for p in "${PIDS[@]}"; do kill -- "-$p" 2>/dev/null || true; done; }
trap stop EXIT
start() {  # start LOG CMD...: in a process group of its own
  local log=$1; shift
  setsid "$@" >"$log" 2>&1 &
  PIDS+=($!)
}
waitfor() {  # waitfor FILE TEXT SECONDS
  for _ in $(seq 1 $((2 * $3))); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.5; done
  echo "timed out waiting for '$2' in $1:"; tail -20 "$1"; exit 1
}
t0=$(date +%s.%N)
elapsed() { python -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f} s')" "$t0" "$(date +%s.%N)"; }

TARGET=""
case "$MODEL" in gmm|gmm-bayes) ;; *) TARGET="--target" ;; esac
python "$ROOT/examples/flower_app/make_data.py" data/ $TARGET >/dev/null
fedstats-certificates certs site_a site_b --flwr-home .flwr >/dev/null
start link.log flower-superlink --ssl-ca-certfile certs/ca.crt --ssl-certfile certs/server.pem \
    --ssl-keyfile certs/server.key --enable-supernode-auth --disable-runtime-dependency-installation
waitfor link.log "Uvicorn running" 60
export FLWR_HOME="$WORK/.flwr"
flwr supernode register certs/site_a.pub local
flwr supernode register certs/site_b.pub local
port=9094
for site in site_a site_b; do
  extra=""
  [ -n "$TARGET" ] && extra=" target='y'"
  start "$site.log" fedstats-supernode --approved-apps "$site-apps.txt" --approve "$ROOT/examples/flower_app" -- \
      --superlink 127.0.0.1:8000 --root-certificates certs/ca.crt --auth-supernode-private-key "certs/$site" \
      --port "$port" --node-config "data-path='data/$site.csv' client='$site'$extra"
  port=$((port + 1))
done
waitfor site_a.log "SuperNode ID" 60
waitfor site_b.log "SuperNode ID" 60
echo "federation up: $(elapsed)"
flwr run "$ROOT/examples/flower_app" local --stream \
    -c "model='$MODEL' components=3 output='$WORK/fit.fedstats' clients='site_a,site_b'"
echo "walk-through done: $(elapsed); result in $WORK/fit.fedstats"
