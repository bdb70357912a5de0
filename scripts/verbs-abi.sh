#!/usr/bin/env bash
# Unmodified ibverbs programs on rsnic through librsnic_verbs.so (issue 22):
# Debian's own binaries (perftest 4.5, ibv_rc_pingpong, ibv_devices,
# ibv_devinfo), nothing rebuilt, run under target/release/rsnic-exec in two
# network namespaces (scripts/netns.sh: TAPs bridged over a veth for the
# data, a kernel veth for perftest's TCP exchange), rsnic on both ends.
#
# Every test must exit 0 on both ends and print its result row; the script
# prints a matrix and exits non-zero on any failure. Logs: target/verbs-abi/.
#
# usage: scripts/verbs-abi.sh [all|quick|abi|eintr|cm|pairs|port|bench]
#   abi:   the C check programs verbs-abi/tests/c/verbs_check.c (gcc against the
#          system's verbs.h, -libverbs, run preloaded on a looped-back net_ring0):
#          bad input, error completions, events, VERBS_CYCLES create/destroy
#          cycles of every object with RSS flat (default 100000);
#          rdmacm_check.c: librdmacm's API, errno of bad calls, a connection
#          of one process to itself through the looped port, REJ, SIDR;
#          verbs_mw_check.c: memory windows (alloc, bind, LOCAL_INV,
#          SEND_WITH_INV, the errno of each bad call);
#          verbs_ex_check.c: ibv_create_qp_ex + ibv_wr_*, ibv_create_cq_ex,
#          ibv_resize_cq, ibv_rereg_mr, every errno of a bad call; then
#          verbs-abi/tests/c/verbs_free_check.c: registered buffers freed and
#          unmapped while the peer WRITEs, READs and does atomics (issue 44);
#          verbs-abi/tests/c/verbs_stress.c, plain and under AddressSanitizer:
#          8 threads, STRESS_OPS verbs (default 100000), STRESS_RACES rounds of
#          get_cq_event racing destroy_cq (default 10000), fork, descriptors,
#          threads, no files left behind, syslog ident (issue 44)
#   eintr: verbs-abi/tests/c/verbs_eintr.c in two namespaces: EINTR_ITERS
#          (default 50000) SENDs of 4 KiB, both ends asleep in poll() on their
#          completion channel, which must never return EINTR (issue 40, item 8:
#          the TAP PMD's per-frame signal goes to the engine's thread)
#   pairs: devinfo, perftest (RC, -c UC, -c UD), ibv_rc/srq/uc/ud_pingpong, ucx_perftest
#          (tag_bw, tag_lat, ucp_put_bw over rc_verbs and ud_verbs) in two namespaces;
#          VERBS_ITERS iterations per test (default 200), VERBS_ALL_ITERS per
#          size of the -a runs (default 100)
#   cm:    rdma_cm programs in two namespaces: rping -v, ucmatose, udaddy (UD
#          over SIDR), rdma_server/rdma_client, ib_{write,send}_bw -R,
#          ib_{read,write}_lat -R, qperf -cm1 rc_bw rc_lat rc_rdma_read_bw,
#          fi_pingpong over libfabric's verbs;ofi_rxm (RDM over RC);
#          CM_ITERS iterations of rping/ucmatose/udaddy (default: rping
#          1000, the others 100);
#          CM_ONLY=REGEX runs only the cases whose name matches;
#          CMTIME_RUNS=N also times N cmtime connects (the median)
#   quick: eintr, devinfo, one bw, one lat, pingpong;  all: abi + eintr + pairs
#   (cm runs on namespaces of its own: scripts/test.sh calls it separately)
#   bench: the same tests through the library (perftest on rsnic) and through
#          roce-perf, alternating, BENCH_ROUNDS rounds (default 3), on the same
#          namespaces: 64 KiB WRITE bandwidth, 64 B WRITE message rate,
#          64 B write_lat t_typical; prints medians and the ratios (not in all)
# Uses host-global namespaces and DPDK: on a shared host run it under
# `flock /tmp/rsnic-host.lock` (scripts/test.sh runs it inside its own lock).
# RSNIC_VERBS_NETNS=PREFIX names the namespaces PREFIX-a / PREFIX-b (default vb).
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
NS=${RSNIC_VERBS_NETNS:-vb}
A=$NS-a
B=$NS-b
EXEC=$PWD/target/release/rsnic-exec
LOG=$PWD/target/verbs-abi
ITERS=${VERBS_ITERS:-200}
ALL_ITERS=${VERBS_ALL_ITERS:-100}
mkdir -p "$LOG"
# Always (a no-op when fresh): `cargo test` does not refresh the cdylib, and a
# stale librsnic_verbs.so would test old code.
cargo build --release -q -p verbs-abi -p rsnic-exec

fails=0
last_status=
rows=()
record() { # name ok detail
  rows+=("$(printf '%-34s %-4s %s' "$1" "$2" "$3")")
  last_status=$2
  [ "$2" = ok ] || fails=$((fails + 1))
}
finish() {
  echo "== verbs-abi: unmodified ibverbs programs on rsnic (logs in $LOG)"
  printf '%s\n' "${rows[@]}"
  if [ $fails -ne 0 ]; then
    echo "verbs-abi: $fails FAILED"
    exit 1
  fi
  echo "verbs-abi: all ${#rows[@]} passed"
  exit 0
}

if [ "$what" = all ] || [ "$what" = abi ]; then
  gcc -O2 -Wall -o "$LOG/verbs_check" verbs-abi/tests/c/verbs_check.c -libverbs
  start=$(date +%s)
  timeout 900 "$EXEC" --dev net_ring0 --ip 10.0.0.9 -- "$LOG/verbs_check" "${VERBS_CYCLES:-100000}" >"$LOG/verbs_check.log" 2>&1
  rc=$?
  grep -E '^(ok|FAIL) ' "$LOG/verbs_check.log" | sed 's/^/  /'
  if [ $rc -eq 0 ]; then
    record "C ABI check (verbs_check.c)" ok "$(grep -c '^ok ' "$LOG/verbs_check.log") checks in $(( $(date +%s) - start )) s"
  else
    record "C ABI check (verbs_check.c)" FAIL "rc $rc: $(grep -E '^FAIL|panic|rsnic:' "$LOG/verbs_check.log" | head -3 | tr '\n' ' ')"
  fi
  # The extended verbs (issue 40, items 5 and 6): ibv_create_qp_ex and the
  # ibv_wr_* API, ibv_create_cq_ex and its iterator, ibv_resize_cq, ibv_rereg_mr.
  gcc -O2 -Wall -o "$LOG/verbs_ex_check" verbs-abi/tests/c/verbs_ex_check.c -libverbs
  start=$(date +%s)
  timeout 300 "$EXEC" --dev net_ring0 --ip 10.0.0.9 -- "$LOG/verbs_ex_check" >"$LOG/verbs_ex_check.log" 2>&1
  rc=$?
  grep -E '^(ok|FAIL) ' "$LOG/verbs_ex_check.log" | sed 's/^/  /'
  if [ $rc -eq 0 ]; then
    record "C extended verbs (verbs_ex_check.c)" ok "$(grep -c '^ok ' "$LOG/verbs_ex_check.log") checks in $(( $(date +%s) - start )) s"
  else
    record "C extended verbs (verbs_ex_check.c)" FAIL "rc $rc: $(grep -E '^FAIL|panic|rsnic:' "$LOG/verbs_ex_check.log" | head -3 | tr '\n' ' ')"
  fi
  # c_check LABEL SOURCE LIBS...: a C check program run preloaded on a
  # looped-back net_ring0 port; it prints ok/FAIL lines and exits 0 when all pass.
  c_check() {
    local label=$1 src=$2 bin
    shift 2
    bin=$LOG/$(basename "$src" .c)
    gcc -O2 -Wall -o "$bin" "$src" "$@"
    local start=$(date +%s)
    timeout 120 "$EXEC" --dev net_ring0 --ip 10.0.0.9 -- "$bin" 10.0.0.9 >"$bin.log" 2>&1
    local rc=$?
    grep -E '^(ok|FAIL) ' "$bin.log" | sed 's/^/  /'
    if [ $rc -eq 0 ]; then
      record "$label" ok "$(grep -c '^ok ' "$bin.log") checks in $(( $(date +%s) - start )) s"
    else
      record "$label" FAIL "rc $rc: $(grep -E '^FAIL|panic|rsnic:' "$bin.log" | head -3 | tr '\n' ' ')"
    fi
  }
  # Memory windows (issue 40 item 6): type 1 and 2B, bind/LOCAL_INV/SEND_WITH_INV
  # through ibv_post_send and the ibv_wr_* builders, and the errno of each bad call.
  c_check "C memory windows (verbs_mw_check.c)" verbs-abi/tests/c/verbs_mw_check.c -libverbs
  # librdmacm's API (issue 41): the errno of each bad call, a listener and a
  # connector of one process through the looped port (REQ/REP/RTU, data,
  # DREQ/DREP), a REJ, UD over SIDR.
  c_check "C rdma_cm (rdmacm_check.c)" verbs-abi/tests/c/rdmacm_check.c -lrdmacm -libverbs
  # Registered memory that outlives the program's mistakes (issue 44 item 1):
  # buffers freed and unmapped while the peer WRITEs, READs and does atomics.
  gcc -O2 -Wall -Wno-use-after-free -o "$LOG/verbs_free_check" verbs-abi/tests/c/verbs_free_check.c -libverbs
  start=$(date +%s)
  timeout 120 "$EXEC" --dev net_ring0 --ip 10.0.0.9 -- "$LOG/verbs_free_check" >"$LOG/verbs_free_check.log" 2>&1
  rc=$?
  grep -aE '^(ok|FAIL) ' "$LOG/verbs_free_check.log" | sed 's/^/  /'
  if [ $rc -eq 0 ]; then
    record "C freed registered memory (verbs_free_check.c)" ok "$(grep -ac '^ok ' "$LOG/verbs_free_check.log") checks in $(( $(date +%s) - start )) s"
  else
    record "C freed registered memory (verbs_free_check.c)" FAIL "rc $rc: $(grep -aE '^FAIL|panic|rsnic:' "$LOG/verbs_free_check.log" | head -3 | tr '\n' ' ')"
  fi
  # Lifetimes, races and hygiene (issue 44): verbs_stress.c plain, then
  # built with AddressSanitizer (a CQ handed out after its destroy is a
  # heap-use-after-free in the program's own read of it); $TMPDIR a fresh
  # directory that must stay empty, and no EAL runtime directory left.
  gcc -O2 -Wall -o "$LOG/verbs_stress" verbs-abi/tests/c/verbs_stress.c -libverbs -lpthread
  gcc -O1 -g -fsanitize=address -fno-omit-frame-pointer -Wall -o "$LOG/verbs_stress_asan" \
    verbs-abi/tests/c/verbs_stress.c -libverbs -lpthread
  for kind in plain asan; do
    bin=$LOG/verbs_stress; [ $kind = asan ] && bin=$LOG/verbs_stress_asan
    tmp=$(mktemp -d)
    start=$(date +%s)
    # verify_asan_link_order=0: the library is preloaded ahead of libasan.
    TMPDIR=$tmp ASAN_OPTIONS=verify_asan_link_order=0:detect_leaks=0:halt_on_error=1 timeout 300 \
      "$EXEC" --dev net_ring0 --ip 10.0.0.9 -- "$bin" "${STRESS_OPS:-100000}" "${STRESS_RACES:-10000}" \
      >"$LOG/verbs_stress_$kind.log" 2>&1
    rc=$?
    pid=$(sed -n 's/^pid //p' "$LOG/verbs_stress_$kind.log")
    left=$(ls -A "$tmp"; [ -n "$pid" ] && ls -d /var/run/dpdk/rsnic-verbs-"$pid" 2>/dev/null)
    rm -rf "$tmp"
    grep -E '^(ok|FAIL) ' "$LOG/verbs_stress_$kind.log" | sed 's/^/  /'
    if [ $rc -eq 0 ] && [ -z "$left" ]; then
      record "C stress and races ($kind)" ok "$(grep -c '^ok ' "$LOG/verbs_stress_$kind.log") checks in $(( $(date +%s) - start )) s, no files left"
    else
      record "C stress and races ($kind)" FAIL "rc $rc, left: ${left:-nothing}: $(grep -E '^FAIL|ERROR|SUMMARY|rsnic:' "$LOG/verbs_stress_$kind.log" | head -3 | tr '\n' ' ')"
    fi
  done
  # The program's own syslog() keeps its ident: in a mount namespace whose
  # /dev is a fresh tmpfs, verbs_stress.c is the syslog daemon (/dev/log).
  unshare -m bash -c "mount --make-rprivate / && mount -t tmpfs tmpfs /dev && mknod -m 666 /dev/null c 1 3 &&
    VERBS_STRESS_SYSLOG=1 timeout 60 '$EXEC' --dev net_ring0 --ip 10.0.0.9 -- '$LOG/verbs_stress' 0 0" \
    >"$LOG/verbs_syslog.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    record "syslog ident kept (verbs_stress.c)" ok "$(grep -o '("<.*")' "$LOG/verbs_syslog.log")"
  else
    record "syslog ident kept (verbs_stress.c)" FAIL "rc $rc: $(grep -E '^FAIL' "$LOG/verbs_syslog.log" | head -2 | tr '\n' ' ')"
  fi
  [ "$what" = abi ] && finish
fi

cleanup() { RSNIC_NETNS=$NS scripts/netns.sh down; }
trap cleanup EXIT
RSNIC_NETNS=$NS scripts/netns.sh up >/dev/null

on_a() { ip netns exec "$A" timeout "${T:-120}" "$EXEC" --dev net_tap0,iface=rt-a --ip 10.0.0.1 ${CC:+--cc $CC} -- "$@"; }
on_b() { ip netns exec "$B" timeout "${T:-120}" "$EXEC" --dev net_tap0,iface=rt-b --ip 10.0.0.2 ${CC:+--cc $CC} -- "$@"; }

# A perftest result row: size, iterations, then figures.
ROW='^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+'

# pair NAME PATTERN PORT SERVER-ARGS... -- CLIENT-ARGS...
pair() {
  local name=$1 pat=$2 port=$3
  shift 3
  local srv=() cli=()
  while [ "$1" != -- ]; do srv+=("$1"); shift; done
  shift
  cli=("$@")
  local f=$LOG/${name//[^A-Za-z0-9_.-]/_}
  on_b "${srv[@]}" >"$f.server" 2>&1 &
  local spid=$!
  # The server listens once its EAL and engine are up.
  for _ in $(seq 100); do
    ip netns exec "$B" ss -ltn 2>/dev/null | grep -q ":$port " && break
    kill -0 $spid 2>/dev/null || break
    sleep 0.2
  done
  on_a "${cli[@]}" >"$f.client" 2>&1
  local crc=$?
  wait $spid
  local src=$?
  local row
  row=$(grep -E "$pat" "$f.client" | tail -1 | tr -s ' ')
  # read_lat's server prints no row (perftest).
  local srow=1
  case $name in ib_read_lat* | ucx_perftest*) ;; *) grep -qE "$pat" "$f.server" || srow="" ;; esac
  if [ $crc -eq 0 ] && [ $src -eq 0 ] && [ -n "$row" ] && [ -n "$srow" ]; then
    record "$name" ok "$row"
  else
    record "$name" FAIL "server rc $src, client rc $crc (logs $f.*): $(tail -2 "$f.client" | tr '\n' ' ')"
  fi
}

if [ "$what" = bench ]; then
  R=$PWD/target/release/roce-perf
  [ -x "$R" ] || cargo build --release -q -p bench --bin roce-perf
  rp_a() { ip netns exec "$A" timeout 120 "$R" "$@" --dev net_tap0,iface=rt-a --ip 10.0.0.1; }
  rp_b() { ip netns exec "$B" timeout 120 "$R" "$@" --dev net_tap0,iface=rt-b --ip 10.0.0.2; }
  # one KIND TEST ARGS -> the figure (bw: BW average MB/s; rate: Mpps; lat: t_typical us)
  one() {
    local kind=$1 t=$2 col f=$LOG/bench
    shift 2
    case $kind in bw) col=4 ;; rate) col=5 ;; lat) col=5 ;; esac
    if [ "$LIBRARY" = 1 ]; then
      on_b "ib_$t" $P "$@" >"$f.server" 2>&1 &
    else
      rp_b "$t" "$@" >"$f.server" 2>&1 &
    fi
    local sp=$!
    for _ in $(seq 100); do ip netns exec "$B" ss -ltn 2>/dev/null | grep -q ":18515 " && break; sleep 0.2; done
    if [ "$LIBRARY" = 1 ]; then
      on_a "ib_$t" $P "$@" 10.99.0.2 >"$f.client" 2>&1
    else
      rp_a "$t" "$@" 10.99.0.2 >"$f.client" 2>&1
    fi
    wait $sp
    grep -E "$ROW" "$f.client" | tail -1 | awk -v c=$col '{print $c}'
  }
  median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "-"}'; }
  P="-d rsnic0 -i 1 -x 0 -F"
  echo "== verbs-abi bench: perftest through librsnic_verbs.so vs roce-perf, same namespaces, ${BENCH_ROUNDS:-3} rounds alternating"
  printf '%-30s %-14s %-14s %s\n' test library roce-perf ratio
  for spec in "bw write_bw -s 65536 -n 20000" "rate write_bw -s 64 -n 200000" "lat write_lat -s 64 -n 20000"; do
    lib=""; rp=""
    for _ in $(seq "${BENCH_ROUNDS:-3}"); do
      lib="$lib $(LIBRARY=1 one $spec)"
      rp="$rp $(LIBRARY=0 one $spec)"
    done
    ml=$(echo "$lib" | median); mr=$(echo "$rp" | median)
    ratio=$(awk -v l="$ml" -v r="$mr" 'BEGIN { if (r > 0 && l > 0) printf "%.2f", l / r; else print "-" }')
    printf '%-30s %-14s %-14s %s   (library:%s; roce-perf:%s)\n' "${spec#* }" "$ml" "$mr" "$ratio" "$lib" "$rp"
  done
  exit 0
fi

# -- rdma_cm (issue 41): Debian's rdmacm-utils, perftest -R, qperf -cm1 and
#    libfabric's fi_pingpong, both ends on rsnic through librsnic_verbs.so's
#    librdmacm. The RDMA addresses are rsnic's (10.0.0.1, 10.0.0.2); qperf and
#    libfabric also reach them over the kernel's ctl veth (their control
#    connection and libfabric's interface list), so each namespace's ctl-*
#    carries its rsnic address too (/32, on a link of its own: no conflict
#    with the TAP bridge that rsnic answers ARP on).
cm_pair() { # NAME CHECK-PATTERN SERVER-ARGS... -- CLIENT-ARGS...
  local name=$1 pat=$2 srv=() cli=()
  shift 2
  while [ "$1" != -- ]; do srv+=("$1"); shift; done
  shift
  cli=("$@")
  local f=$LOG/cm-${name//[^A-Za-z0-9_.-]/_}
  [[ "$name" =~ ${CM_ONLY:-.} ]] || return 0
  on_b "${srv[@]}" >"$f.server" 2>&1 &
  local spid=$!
  sleep "${CM_START_S:-2.5}"
  on_a "${cli[@]}" >"$f.client" 2>&1
  local crc=$?
  wait $spid
  local src=$?
  local row
  row=$(grep -E "$pat" "$f.client" | tail -1 | tr -s ' ')
  if [ $crc -eq 0 ] && [ $src -eq 0 ] && [ -n "$row" ]; then
    record "$name" ok "${row:0:90}"
  else
    record "$name" FAIL "server rc $src, client rc $crc (logs $f.*): $(tail -2 "$f.client" | tr '\n' ' ')"
  fi
}
if [ "$what" = cm ]; then
  # The kernels must not answer ARP for these addresses on the TAP bridges:
  # rsnic's peer would then send its RoCE frames to the bridge's MAC.
  for ns in "$A" "$B"; do ip netns exec "$ns" sysctl -qw net.ipv4.conf.all.arp_ignore=1; done
  ip -n "$A" addr add 10.0.0.1/32 dev ctl-a && ip -n "$A" route add 10.0.0.2/32 dev ctl-a
  ip -n "$B" addr add 10.0.0.2/32 dev ctl-b && ip -n "$B" route add 10.0.0.1/32 dev ctl-b
  CMI=${CM_ITERS:-100}
  # rping: the issue's 1000 pings (a few seconds), each checked.
  RPI=${CM_ITERS:-1000}
  # rping: every ping's data is checked (-v prints it, the server checks it).
  cm_pair "rping -v -C $RPI" "ping data: rdma-ping-$((RPI - 1))" rping -s -a 10.0.0.2 -v -C $RPI -- rping -c -a 10.0.0.2 -v -C $RPI
  cm_pair "ucmatose -c 4 -C $CMI" '^return status 0' ucmatose -b 10.0.0.2 -c 4 -C $CMI -- ucmatose -s 10.0.0.2 -c 4 -C $CMI
  cm_pair "udaddy -c 2 -C $CMI (SIDR)" '^return status 0' udaddy -b 10.0.0.2 -c 2 -C $CMI -- udaddy -s 10.0.0.2 -c 2 -C $CMI
  cm_pair "rdma_server / rdma_client" 'rdma_client: end 0' rdma_server -s 10.0.0.2 -- rdma_client -s 10.0.0.2
  P="-d rsnic0 -F -R"
  for t in "ib_write_bw -s 65536" "ib_send_bw -s 4096" "ib_read_lat -s 2" "ib_write_lat -s 2"; do
    cm_pair "$t -R" "$ROW" $t $P -n $ITERS -- $t $P -n $ITERS 10.0.0.2
  done
  if command -v qperf >/dev/null; then
    # Debian's qperf 0.4.11 sends its server's rdma_cm port before it calls
    # rdma_listen (fixed upstream after 0.4.11: linux-rdma/qperf 118a571 "Fix
    # rdmacm race"): when the server's thread is preempted between the two,
    # the client's REQ finds no listener and gets the REJ "invalid service ID"
    # that any CM sends then (Linux's ib_cm too). That one failure, and only
    # it, is run again once, and said so.
    qperf_case() {
      cm_pair "qperf -cm1 rc_bw rc_lat rc_rdma_read_bw$1" 'rc_rdma_read_bw' qperf -- \
        qperf -cm1 -t 2 10.0.0.2 rc_bw rc_lat rc_rdma_read_bw quit
    }
    qperf_case ""
    qf=$LOG/cm-qperf_-cm1_rc_bw_rc_lat_rc_rdma_read_bw.client
    if [ "$last_status" = FAIL ] && grep -q "Event rejected" "$qf"; then
      unset 'rows[-1]'
      fails=$((fails - 1))
      cp "$qf" "$qf.raced"
      qperf_case " (again: qperf 0.4.11's listen race)"
    fi
  fi
  # Connections that end badly (verbs-abi/tests/c/cm_fault.c), with the CM's
  # timeouts short (RSNIC_CM_TIMEOUT 16: 0.27 s a try, 3 retries): a server
  # that dies with the request unanswered (the client's REQ retries end in
  # UNREACHABLE, -ETIMEDOUT), and a server that disconnects first.
  gcc -O2 -Wall -o "$LOG/cm_fault" verbs-abi/tests/c/cm_fault.c -lrdmacm -libverbs
  fault_pair() { # NAME SERVER-MODE SERVER-RC CLIENT-MODE PORT
    local name=$1 smode=$2 want_src=$3 cmode=$4 port=$5
    [[ "$name" =~ ${CM_ONLY:-.} ]] || return 0
    local f=$LOG/cm-fault-$cmode
    (export RSNIC_CM_TIMEOUT=16 RSNIC_CM_RETRIES=3; on_b "$LOG/cm_fault" "$smode" 10.0.0.2 "$port") >"$f.server" 2>&1 &
    local spid=$!
    for _ in $(seq 100); do grep -q '^listening' "$f.server" 2>/dev/null && break; sleep 0.1; done
    (export RSNIC_CM_TIMEOUT=16 RSNIC_CM_RETRIES=3; on_a "$LOG/cm_fault" "$cmode" 10.0.0.2 "$port") >"$f.client" 2>&1
    local crc=$?
    wait $spid
    local src=$?
    if [ $crc -eq 0 ] && [ $src -eq "$want_src" ]; then
      record "$name" ok "$(grep -E 'after|DISCONNECTED' "$f.client" | tail -1 | cut -c6-90)"
    else
      record "$name" FAIL "server rc $src (want $want_src), client rc $crc (logs $f.*): $(grep -h FAIL "$f.client" "$f.server" | head -2 | tr '\n' ' ')"
    fi
  }
  # The dying server exits 137 (its own SIGKILL).
  fault_pair "peer dies mid-connect: UNREACHABLE" server-dies 137 client-unreachable 7481
  fault_pair "server disconnects first" server-disconnects 0 client-disconnected 7482
  # Connection set-up time (docs/connection.md; only with CMTIME_RUNS=N):
  # cmtime -c 1's "connect" step (rdma_connect to ESTABLISHED), N runs, the
  # median; every run is a new pair of processes (the first includes ARP).
  if [ -n "${CMTIME_RUNS:-}" ]; then
    rm -f "$LOG"/cmtime.*
    for _ in $(seq "$CMTIME_RUNS"); do
      on_b cmtime -b 10.0.0.2 -c 1 >/dev/null 2>&1 &
      sleep 2
      on_a cmtime -s 10.0.0.2 -c 1 2>"$LOG/cmtime.err" | tee -a "$LOG/cmtime.out" | awk '/^connect/ {print $3}'
      wait
    done | grep -E '^[0-9.]+$' >"$LOG/cmtime.ms"
    ms=$(sort -g "$LOG/cmtime.ms" | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]}')
    echo "cmtime connect, rsnic -> rsnic (ms): median ${ms:-none} of $(wc -l <"$LOG/cmtime.ms"): $(tr '\n' ' ' <"$LOG/cmtime.ms")"
  fi
  # libfabric's verbs provider binds "localhost" to learn its source address:
  # the id has no device then (as on Linux), so it takes the device's
  # interface addresses, and rxm listens on 10.0.0.2.
  cm_pair 'fi_pingpong -p "verbs;ofi_rxm"' '^[0-9]+k? +[0-9]+k? +=' fi_pingpong -p "verbs;ofi_rxm" -e rdm -I 1000 -S 4096 -c -- \
    fi_pingpong -p "verbs;ofi_rxm" -e rdm -I 1000 -S 4096 -c 10.0.0.2
  finish
fi

# -- 0. a quiet guest: the program's thread asleep in poll() on its completion
#       channel sees no EINTR over a long transfer over the TAPs
if [ "$what" = all ] || [ "$what" = quick ] || [ "$what" = eintr ]; then
  gcc -O2 -Wall -o "$LOG/verbs_eintr" verbs-abi/tests/c/verbs_eintr.c -libverbs
  f=$LOG/eintr
  on_b "$LOG/verbs_eintr" -n "${EINTR_ITERS:-50000}" >"$f.server" 2>&1 &
  sp=$!
  for _ in $(seq 100); do
    ip netns exec "$B" ss -ltn 2>/dev/null | grep -q ":18600 " && break
    kill -0 $sp 2>/dev/null || break
    sleep 0.2
  done
  on_a "$LOG/verbs_eintr" -n "${EINTR_ITERS:-50000}" 10.99.0.2 >"$f.client" 2>&1
  crc=$?
  wait $sp
  src=$?
  if [ $crc -eq 0 ] && [ $src -eq 0 ]; then
    record "no EINTR in poll (verbs_eintr.c)" ok "client: $(grep '^eintr:' "$f.client"); server: $(grep '^eintr:' "$f.server")"
  else
    record "no EINTR in poll (verbs_eintr.c)" FAIL "client rc $crc: $(tail -1 "$f.client"); server rc $src: $(tail -1 "$f.server")"
  fi
  [ "$what" = eintr ] && finish
fi

# -- 1. ibv_devices, ibv_devinfo -v (one process, in namespace A)
f=$LOG/devices
on_a ibv_devices >"$f" 2>&1
if grep -q rsnic0 "$f"; then record ibv_devices ok "$(grep rsnic0 "$f" | tr -s ' \t' ' ')"; else record ibv_devices FAIL "$(tail -2 "$f" | tr '\n' ' ')"; fi
f=$LOG/devinfo
on_a ibv_devinfo -v >"$f" 2>&1
rc=$?
miss=""
for want in 'hca_id:[[:space:]]*rsnic0' 'state:[[:space:]]*PORT_ACTIVE' 'link_layer:[[:space:]]*Ethernet' 'GID\[ *0\]:.*(::ffff:10\.0\.0\.1|0000:0000:0000:0000:0000:ffff:0a00:0001)' 'RoCE v2'; do
  grep -qE "$want" "$f" || miss="$miss '$want'"
done
if [ $rc -eq 0 ] && [ -z "$miss" ]; then
  record "ibv_devinfo -v" ok "$(grep -E 'state:|link_layer|GID' "$f" | tr -s ' \t' ' ' | tr '\n' ';')"
else
  record "ibv_devinfo -v" FAIL "rc $rc, missing:$miss"
fi
# UCX (Debian's ucx-utils, where installed) lists rsnic0 only where
# /dev/infiniband/uverbs_rsnic0 is a character device (the library's stat and
# access): rc_verbs and ud_verbs on rsnic0:1.
if command -v ucx_info >/dev/null; then
  f=$LOG/ucx_info
  on_a ucx_info -d >"$f" 2>&1
  n=$(grep -A1 -E 'Transport: (rc|ud)_verbs' "$f" | grep -c 'Device: rsnic0:1')
  if [ "$n" = 2 ]; then
    record "ucx_info -d" ok "rc_verbs and ud_verbs on rsnic0:1"
  else
    record "ucx_info -d" FAIL "$n of rc_verbs, ud_verbs on rsnic0:1 (log $f)"
  fi
fi
# A quiet guest: the EAL and the TAP PMD print nothing into the program's
# output unless RSNIC_LOG asks (they used to: "Could not add multiq qdisc"...).
on_a ibv_devinfo >/dev/null 2>"$f.stderr"
rc=$?
if [ $rc -eq 0 ] && [ ! -s "$f.stderr" ]; then
  record "nothing on stderr (ibv_devinfo)" ok "RSNIC_LOG unset: 0 bytes"
else
  record "nothing on stderr (ibv_devinfo)" FAIL "rc $rc: $(head -2 "$f.stderr" | tr '\n' ' ')"
fi

# -- 1b. a second program on the same port is refused with a message, and the
#        first one goes on (ibv_rc_pingpong's server waits; ibv_devinfo tries rt-a)
f=$LOG/second
on_a ibv_rc_pingpong -d rsnic0 -g 0 -n 5 >"$f.first" 2>&1 &
first=$!
for _ in $(seq 100); do ip netns exec "$A" ss -ltn 2>/dev/null | grep -q ":18515 " && break; sleep 0.2; done
T=30 on_a ibv_devinfo >"$f.second" 2>&1
rc=$?
T=60 on_b ibv_rc_pingpong -d rsnic0 -g 0 -n 5 10.99.0.1 >"$f.peer" 2>&1
prc=$?
wait $first
frc=$?
if grep -q "in use by another rsnic program" "$f.second" && [ $frc -eq 0 ] && [ $prc -eq 0 ]; then
  record "second program on the port" ok "$(grep -o 'port .*program' "$f.second" | head -1); the first completed its run"
else
  record "second program on the port" FAIL "devinfo rc $rc, first rc $frc, its peer rc $prc: $(tail -1 "$f.second")"
fi
[ "$what" = port ] && finish

# -- 2. perftest, both ends on rsnic (client in A, server in B over ctl 10.99.0.2)
P="-d rsnic0 -i 1 -x 0 -F"
bw() { pair "$1 $2" "$ROW" 18515 "$1" $P $2 -- "$1" $P $2 10.99.0.2; }
if [ "$what" = quick ]; then
  bw ib_write_bw "-s 65536 -n $ITERS"
  pair "ib_write_lat -s 2" "$ROW" 18515 ib_write_lat $P -s 2 -n $ITERS -- ib_write_lat $P -s 2 -n $ITERS 10.99.0.2
else
  for t in ib_write_bw ib_read_bw ib_send_bw; do
    # -a moves 2 x 8 MiB x N. READ responses have no window without a CC, so
    # on a loaded 2-core machine the receiving TAP's queue drops some of them
    # and go-back-N re-requests: give -a four minutes, not two.
    T=240 bw $t "-a -n $ALL_ITERS"
    bw $t "-q 4 -s 65536 -n $ITERS"
  done
  for t in ib_write_lat ib_read_lat ib_send_lat; do
    for s in 2 65536; do
      pair "$t -s $s" "$ROW" 18515 $t $P -s $s -n $ITERS -- $t $P -s $s -n $ITERS 10.99.0.2
    done
  done
  bw ib_atomic_bw "-n $ITERS"
fi

# -- 2b. mixed: perftest on rsnic against roce-perf (perftest's exchange), both roles
R=$PWD/target/release/roce-perf
[ -x "$R" ] || cargo build --release -q -p bench --bin roce-perf
if [ "$what" != quick ]; then
  for t in write_bw read_bw send_bw write_lat; do
    # roce-perf serves (it detects perftest's exchange), perftest on rsnic connects
    f=$LOG/mixed-$t-rpserver
    ip netns exec "$B" timeout 120 "$R" $t --dev net_tap0,iface=rt-b --ip 10.0.0.2 -s 4096 -n $ITERS --timeout 60 >"$f.server" 2>&1 &
    sp=$!
    for _ in $(seq 100); do ip netns exec "$B" ss -ltn 2>/dev/null | grep -q ":18515 " && break; sleep 0.2; done
    on_a ib_$t $P -s 4096 -n $ITERS 10.99.0.2 >"$f.client" 2>&1; crc=$?
    wait $sp; src=$?
    row=$(grep -E "$ROW" "$f.client" | tail -1 | tr -s ' ')
    if [ $crc -eq 0 ] && [ $src -eq 0 ] && [ -n "$row" ]; then record "ib_$t (rsnic) -> roce-perf" ok "$row"
    else record "ib_$t (rsnic) -> roce-perf" FAIL "roce-perf rc $src, perftest rc $crc ($f.*): $(tail -1 "$f.client")"; fi
    # perftest on rsnic serves, roce-perf connects with perftest's exchange
    f=$LOG/mixed-$t-rpclient
    on_b ib_$t $P -s 4096 -n $ITERS >"$f.server" 2>&1 &
    sp=$!
    for _ in $(seq 100); do ip netns exec "$B" ss -ltn 2>/dev/null | grep -q ":18515 " && break; sleep 0.2; done
    ip netns exec "$A" timeout 120 "$R" $t --dev net_tap0,iface=rt-a --ip 10.0.0.1 -s 4096 -n $ITERS --timeout 60 --exchange perftest 10.99.0.2 >"$f.client" 2>&1; crc=$?
    wait $sp; src=$?
    row=$(grep -E "$ROW" "$f.server" | tail -1 | tr -s ' ')
    if [ $crc -eq 0 ] && [ $src -eq 0 ] && [ -n "$row" ]; then record "roce-perf -> ib_$t (rsnic)" ok "$row"
    else record "roce-perf -> ib_$t (rsnic)" FAIL "roce-perf rc $crc, perftest rc $src ($f.*): $(tail -1 "$f.server")"; fi
  done
fi

# -- 3. ibv_rc_pingpong: -c checks the data, -e sleeps on completion events, -N
#       posts through the ibv_wr_* API
PP='bytes in [0-9.]+ seconds'
pair "ibv_rc_pingpong -g 0 -c" "$PP" 18515 ibv_rc_pingpong -d rsnic0 -g 0 -c -n 500 -- ibv_rc_pingpong -d rsnic0 -g 0 -c -n 500 10.99.0.2
pair "ibv_rc_pingpong -g 0 -e" "$PP" 18515 ibv_rc_pingpong -d rsnic0 -g 0 -e -n 500 -- ibv_rc_pingpong -d rsnic0 -g 0 -e -n 500 10.99.0.2
# -N: ibv_create_qp_ex with IBV_QP_EX_WITH_SEND and ibv_wr_start/send/set_sge/complete
pair "ibv_rc_pingpong -g 0 -N -c" "$PP" 18515 ibv_rc_pingpong -d rsnic0 -g 0 -N -c -n 500 -- ibv_rc_pingpong -d rsnic0 -g 0 -N -c -n 500 10.99.0.2
# -- 4. ibv_srq_pingpong: 16 QPs on one shared receive queue, data checked
pair "ibv_srq_pingpong -g 0 -q 16 -c" "$PP" 18515 ibv_srq_pingpong -d rsnic0 -g 0 -q 16 -c -n 200 -- ibv_srq_pingpong -d rsnic0 -g 0 -q 16 -c -n 200 10.99.0.2
# -- 5. UC and UD: the pingpongs check the data (UD: the 40-byte GRH in front
#       of it, address handles), perftest's -c UC/UD. UD messages fit the MTU;
#       UC SENDs of 4 KiB keep the receiver's queue ahead of a sender that
#       nothing paces (UC has no ACKs and a lost packet loses the message)
pair "ibv_uc_pingpong -g 0 -c" "$PP" 18515 ibv_uc_pingpong -d rsnic0 -g 0 -c -n 200 -- ibv_uc_pingpong -d rsnic0 -g 0 -c -n 200 10.99.0.2
pair "ibv_ud_pingpong -g 0 -s 1024 -c" "$PP" 18515 ibv_ud_pingpong -d rsnic0 -g 0 -s 1024 -c -n 200 -- ibv_ud_pingpong -d rsnic0 -g 0 -s 1024 -c -n 200 10.99.0.2
if [ "$what" != quick ]; then
  bw ib_send_bw "-c UD -s 1024 -n $ITERS"
  bw ib_send_bw "-c UC -s 4096 -n $ITERS"
  bw ib_write_bw "-c UC -s 65536 -n $ITERS"
fi
# -- 6. UCX (Debian's ucx-utils, where installed): ucx_perftest's UCP tests
#       over rc_verbs (ud_verbs only for UCP's wire-up, as UCX_TLS=rc does)
#       and over ud_verbs alone. UCX 1.13's ud_verbs needs
#       UCX_UD_VERBS_ETH_DGID_CHECK=n on any device that leaves ibv_wc.sl 0
#       (docs/verbs.md); the client prints the row.
if [ "$what" != quick ] && command -v ucx_perftest >/dev/null; then
  export UCX_NET_DEVICES=rsnic0:1 UCX_UD_VERBS_ETH_DGID_CHECK=n
  for tls in rc_verbs,ud_verbs:aux ud_verbs; do
    for t in "tag_bw -s 65536 -n $ITERS" "tag_lat -s 8 -n 1000" "ucp_put_bw -s 65536 -n $ITERS"; do
      UCX_TLS=$tls pair "ucx_perftest -t $t ($tls)" '^Final:' 13337 ucx_perftest -- ucx_perftest 10.99.0.2 -t $t
    done
  done
  unset UCX_NET_DEVICES UCX_UD_VERBS_ETH_DGID_CHECK
fi

finish
