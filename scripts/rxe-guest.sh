#!/usr/bin/env bash
# Linux SoftRoCE (rdma_rxe) with the real perftest in QEMU guests: the
# standard RoCEv2 peer that roce-perf is checked against (README,
# "Interoperability").
#
# Everything lives in one network namespace, rxe-ns, so that nothing leaks
# into the host's network:
#
#   rxe-ns:  rxe-br0 (bridge, 10.0.0.254/24: the TCP side of the exchanges)
#              |- rxe-tap0  guest rxe0 (10.0.0.2, 52:54:00:00:00:02)
#              |- rsnic-tap0  persistent multi-queue TAP for the NIC
#              |              (roce-perf --dev net_tap0,iface=rsnic-tap0
#              |               --ip 10.0.0.1, run with `ip netns exec rxe-ns`)
#              `- rsnic-sw0   roce-switch port 0 (gateway 10.0.0.253)
#            rxe-br1 (bridge, no address)
#              |- rxe-tap1  guest rxe1 (10.0.1.3, 52:54:00:00:00:03)
#              `- rsnic-sw1   roce-switch port 1 (gateway 10.0.1.253)
#
#   rxe0 and rxe1 reach each other only through roce-switch (all IPv4, the
#   perftest exchange included), which routes 10.0.0.0/24 and 10.0.1.0/24.
#
# The guest is a Debian kernel (its rdma_rxe.ko) with a small initramfs built
# from the host's own files (busybox, iproute2, rdma-core, perftest). It runs
# TCG (no KVM needed): up with rxe0 ACTIVE in about 5 s. A control agent on
# the guest's second serial port (a unix socket on the host) runs scripts in
# the running guest, so one boot serves many tests.
#
# usage:
#   rxe-guest.sh build                       build the initramfs ($RXE_DIR)
#   rxe-guest.sh agent-check                 check the control agent on the host
#   rxe-guest.sh net-up | net-down           the namespace, bridge and TAPs
#   rxe-guest.sh boot NAME                   boot guest NAME (rxe0 or rxe1)
#   rxe-guest.sh start NAME ID 'script'      run a script in the background
#   rxe-guest.sh wait NAME ID [SECS]         its output; exit code = the script's
#   rxe-guest.sh run NAME 'script' [SECS]    start + wait
#   rxe-guest.sh stop NAME                   power it off
#   rxe-guest.sh down                        stop every guest, remove the network
#
# Needs (scripts/setup.sh installs them): qemu-system-x86 linux-image-amd64
# rdma-core ibverbs-utils ibverbs-providers perftest busybox-static iproute2
# cpio kmod python3.
set -euo pipefail
D=${RXE_DIR:-/tmp/rxe-guest}
NS=rxe-ns
BR=rxe-br0
NIC_TAP=rsnic-tap0

die() { echo "rxe-guest: $*" >&2; exit 1; }

guest_params() { # NAME -> TAP IP MAC
  case "$1" in
    rxe0) echo "rxe-tap0 10.0.0.2 52:54:00:00:00:02" ;;
    rxe1) echo "rxe-tap1 10.0.1.3 52:54:00:00:00:03" ;;
    *) die "unknown guest $1 (rxe0 or rxe1)" ;;
  esac
}

kernel_version() {
  ls /lib/modules | grep -E 'amd64$' | sort -V | tail -1
}

# The guest's control agent (installed as /agent in the image).
agent_script() {
  cat <<'AGENT'
#!/bin/sh
# The control agent on ttyS1: "START id base64-script" runs it in the
# background; "WAIT id secs" answers with the base64 of its output and
# "== rc=N"; "PING" -> "== pong". Arguments (for agent-check): the port
# and the work directory.
#
# busybox's `read` drops the part of a line it has already read when a
# signal interrupts it, and a serial line arrives slowly enough for that to
# happen. So the agent must never get a SIGCHLD while it reads: each job is
# started by a subshell that the agent waits for and that exits at once,
# and the job, orphaned, belongs to PID 1 from then on.
P=${1:-/dev/ttyS1} W=${2:-/tmp}
exec 3<>"$P"
while read -r cmd id arg <&3; do
  case $cmd in
    PING) echo "== pong" >&3 ;;
    START)
      echo "$arg" | base64 -d > $W/$id.sh
      rm -f $W/$id.rc $W/$id.out
      ( (sh $W/$id.sh > $W/$id.out 2>&1; echo $? > $W/$id.rc.tmp; mv $W/$id.rc.tmp $W/$id.rc) &
        echo $! > $W/$id.pid )
      echo "== started $id" >&3 ;;
    WAIT)
      n=0; lim=$(( ${arg:-60} * 10 ))
      while [ ! -f $W/$id.rc ] && [ $n -lt $lim ]; do sleep 0.1; n=$((n+1)); done
      if [ ! -f $W/$id.rc ]; then
        kill $(cat $W/$id.pid) 2>/dev/null
        echo 124 > $W/$id.rc
        echo "rxe guest: timed out after ${arg}s" >> $W/$id.out
      fi
      base64 $W/$id.out >&3
      echo "== rc=$(cat $W/$id.rc)" >&3 ;;
    POWEROFF) echo "== bye" >&3; sync; poweroff -f ;;
    *) echo "== unknown command: $(echo "$cmd $id" | cut -c1-40)" >&3 ;;
  esac
done
AGENT
}

# Checks the agent on the host's busybox, on a pseudo-terminal in raw mode:
# a job ends while its WAIT line is still arriving, a byte every 40 ms as a
# slow serial line delivers it, and the agent must answer the whole command
# (the job's output and rc).
agent_check() {
  local t rc=0
  t=$(mktemp -d)
  agent_script > "$t/agent"
  python3 - "$t" <<'PY' || rc=$?
import base64, os, pty, select, subprocess, sys, time, tty
work = sys.argv[1]
master, slave = pty.openpty()
tty.setraw(slave)
agent = subprocess.Popen(["busybox", "sh", work + "/agent", os.ttyname(slave), work],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
def answer(timeout=10):
    buf, end = b"", time.time() + timeout
    while time.time() < end:
        if select.select([master], [], [], 0.1)[0]:
            buf += os.read(master, 4096)
            if any(l.startswith(b"== ") for l in buf.split(b"\n")):
                return buf
    return buf
try:
    job = base64.b64encode(b"sleep 0.2; echo done").decode()
    os.write(master, f"START j1 {job}\n".encode())
    got = answer()
    if b"== started j1" not in got:
        sys.exit(f"agent-check: START answered {got!r}")
    for c in b"WAIT j1 30\n":
        os.write(master, bytes([c]))
        time.sleep(0.04)
    got = answer()
    lines = got.split(b"\n")
    if b"== rc=0" not in lines or base64.b64decode(b"".join(lines[:lines.index(b"== rc=0")])) != b"done\n":
        sys.exit(f"agent-check: WAIT, with the job ending mid-line, answered {got!r}")
    print("agent-check: a WAIT line that a job's end interrupts is answered whole")
finally:
    agent.kill()
PY
  rm -rf "$t"
  return $rc
}

# Builds the guest image once: under a lock (so that guests booted at the
# same time never build into the same place), into a fresh directory that
# is renamed into place only when complete ($D/image: vmlinuz, initramfs.gz,
# stamp). A guest boots from whatever complete image is in place.
build() {
  mkdir -p "$D"
  exec 9>"$D/build.lock"
  flock 9
  build_locked
  exec 9>&-
}

build_locked() {
  local K R T need libs progs prov stamp
  K=$(kernel_version) || true
  [ -n "$K" ] || die "no Debian amd64 kernel in /lib/modules (apt-get install linux-image-amd64)"
  [ -f "/boot/vmlinuz-$K" ] || die "/boot/vmlinuz-$K missing"
  # Rebuilt when the kernel, this script (the guest's init) or verbs_agree.c
  # changes.
  local agree
  agree=$(cd "$(dirname "$0")/.." && pwd)/verbs-abi/tests/c/verbs_agree.c
  stamp="$K $(sha256sum "$0" | cut -c1-16) $(sha256sum "$agree" | cut -c1-16)"
  if [ -f "$D/image/initramfs.gz" ] && [ "$(cat "$D/image/stamp" 2>/dev/null)" = "$stamp" ]; then
    return 0
  fi
  rm -rf "$D"/image.new.*
  T=$(mktemp -d "$D/image.new.XXXXXX")
  chmod 755 "$T"
  R=$T/root
  mkdir -p "$R"/{bin,sbin,etc,proc,sys,dev,tmp,lib,lib64,usr/lib,usr/bin,usr/sbin,run,root}
  cp /bin/busybox "$R/bin/busybox"
  for a in sh mount ip modprobe sleep cat echo ls ps kill poweroff sync mkdir dmesg grep \
           sed awk timeout seq head tail wc base64 stty rm tr cut date test true false; do
    ln -sf busybox "$R/bin/$a"
  done
  # rxe needs the crc32 crypto driver before it loads (no crc32 algorithm: -2).
  need=""
  for m in crc32_generic rdma_rxe ib_uverbs rdma_ucm virtio_pci virtio_net; do
    need="$need $(modprobe -S "$K" --show-depends "$m" | awk '/^insmod/{print $2}')"
  done
  for f in $(echo $need | tr ' ' '\n' | sort -u); do
    mkdir -p "$R$(dirname "$f")"; cp "$f" "$R$f"
  done
  cp /lib/modules/"$K"/modules.order /lib/modules/"$K"/modules.builtin* "$R/lib/modules/$K/" 2>/dev/null || true
  depmod -b "$R" "$K"
  # verbs_agree: the same verbs on rxe as on rsnic (scripts/interop.sh agree).
  gcc -O2 -Wall -o "$R/usr/bin/verbs_agree" "$agree" -libverbs || die "cannot build $agree (apt-get install gcc libibverbs-dev)"
  progs="/usr/bin/ib_write_bw /usr/bin/ib_read_bw /usr/bin/ib_send_bw /usr/bin/ib_write_lat
         /usr/bin/ib_read_lat /usr/bin/ib_send_lat /usr/bin/ibv_devinfo /usr/bin/ibv_rc_pingpong
         /usr/bin/ibv_uc_pingpong /usr/bin/ibv_ud_pingpong /usr/bin/ibv_srq_pingpong
         /usr/bin/rdma /sbin/ip /bin/ip /usr/bin/rping /usr/bin/cmtime"
  libs=$(ldd "$R/usr/bin/verbs_agree" | awk '/=>/{print $3} /ld-linux/{print $1}')
  for p in $progs; do
    [ -e "$p" ] || continue
    mkdir -p "$R$(dirname "$p")"
    rm -f "$R$p"
    cp -L "$p" "$R$p"
    libs="$libs $(ldd "$p" | awk '/=>/{print $3} /ld-linux/{print $1}')"
  done
  # iproute2's ip replaces busybox's (neighbour entries, statistics).
  [ -e "$R/sbin/ip" ] && ln -sf /sbin/ip "$R/bin/ip"
  for p in ib_write_bw ib_read_bw ib_send_bw ib_write_lat ib_read_lat ib_send_lat; do
    [ -e "$R/usr/bin/$p" ] || die "/usr/bin/$p missing (apt-get install perftest)"
  done
  prov=$(ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-*.so 2>/dev/null | head -1)
  [ -n "$prov" ] || die "no rxe verbs provider (apt-get install ibverbs-providers)"
  libs="$libs $prov $(ldd "$prov" | awk '/=>/{print $3}')"
  # glibc dlopens libgcc_s for pthread_exit/cancel (rping's threads).
  libs="$libs $(ls /lib/x86_64-linux-gnu/libgcc_s.so.1 2>/dev/null)"
  for l in $(echo $libs | tr ' ' '\n' | sort -u); do
    [ -e "$l" ] || continue
    mkdir -p "$R$(dirname "$l")"; cp -L "$l" "$R$l"
  done
  mkdir -p "$R/etc/libibverbs.d"
  cp /etc/libibverbs.d/rxe.driver "$R/etc/libibverbs.d/"
  echo "root:x:0:0:root:/root:/bin/sh" > "$R/etc/passwd"
  cat > "$R/init" <<'INIT'
#!/bin/sh
# rsnic rxe guest: brings up rxe0 on eth0, then runs the control agent
# (/agent) on ttyS1. The agent is a child of this shell, not PID 1 itself:
# see /agent for why.
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
for m in crc32_generic virtio_pci virtio_net rdma_rxe ib_uverbs rdma_ucm; do modprobe $m; done
ip link set lo up
ip link set eth0 up
for kv in $(cat /proc/cmdline); do
  case $kv in guest_ip=*) ip addr add ${kv#guest_ip=}/24 dev eth0;; esac
done
rdma link add rxe0 type rxe netdev eth0
i=0; while [ $i -lt 50 ] && ! ibv_devinfo -d rxe0 2>/dev/null | grep -q PORT_ACTIVE; do sleep 0.1; i=$((i+1)); done
echo "== guest ready"
ibv_devinfo -d rxe0 | grep -E 'state|active_mtu'
stty -F /dev/ttyS1 raw -echo 115200
# PID 1 waits here, and so also reaps the agent's orphaned jobs.
sh /agent
echo "== agent exited"
INIT
  agent_script > "$R/agent"
  chmod +x "$R/init" "$R/agent"
  cp "/boot/vmlinuz-$K" "$T/vmlinuz"
  (cd "$R" && find . | cpio -o -H newc 2>/dev/null | gzip -1 > "$T/initramfs.gz")
  rm -rf "$R"
  echo "$stamp" > "$T/stamp"
  # Into place: the old image (if any) aside first, then one rename.
  rm -rf "$D/image.old"
  [ -d "$D/image" ] && mv -T "$D/image" "$D/image.old"
  mv -T "$T" "$D/image"
  rm -rf "$D/image.old"
  echo "rxe-guest: built $D/image/initramfs.gz ($(du -h "$D/image/initramfs.gz" | cut -f1)), kernel $K"
}

in_ns() { ip netns exec "$NS" "$@"; }

net_up() {
  ip netns list | grep -qw "$NS" && net_down
  ip netns add "$NS"
  in_ns ip link set lo up
  in_ns sysctl -qw net.ipv6.conf.all.disable_ipv6=1
  # A loaded br_netfilter makes the bridge drop frames whose IPv4 header it
  # dislikes; the bridge here forwards, it does not filter.
  for f in iptables ip6tables arptables; do
    [ -e /proc/sys/net/bridge/bridge-nf-call-$f ] && in_ns sysctl -qw net.bridge.bridge-nf-call-$f=0 || true
  done
  in_ns ip link add "$BR" type bridge
  # A fixed MAC: a bridge otherwise takes its ports' smallest, and the DPDK
  # TAP PMD gives rsnic-tap0 a new random MAC at every start, so the
  # guests' ARP entry for 10.0.0.254 would go stale and their TCP
  # connections to the host hang until it is resolved again.
  in_ns ip link set "$BR" address 02:52:53:00:00:fe
  in_ns ip link set "$BR" type bridge forward_delay 0 stp_state 0
  in_ns ip addr add 10.0.0.254/24 dev "$BR"
  in_ns ip link add rxe-br1 type bridge
  in_ns ip link set rxe-br1 type bridge forward_delay 0 stp_state 0
  in_ns ip link set rxe-br1 address 02:52:53:00:01:fe
  for t in rxe-tap0:$BR rxe-tap1:rxe-br1; do
    in_ns ip tuntap add dev "${t%%:*}" mode tap
    in_ns ip link set "${t%%:*}" master "${t##*:}"
    in_ns ip link set "${t%%:*}" up
  done
  for t in "$NIC_TAP:$BR" rsnic-sw0:$BR rsnic-sw1:rxe-br1; do
    in_ns ip tuntap add dev "${t%%:*}" mode tap multi_queue
    in_ns ip link set "${t%%:*}" master "${t##*:}"
    in_ns ip link set "${t%%:*}" up
  done
  in_ns ip link set "$BR" up
  in_ns ip link set rxe-br1 up
}

net_down() {
  ip netns del "$NS" 2>/dev/null || true
}

# The host side of the control agent: sends one command line, prints the
# answer up to its "== ..." line (decoding base64 output), exits with the
# script's code.
ctl() { # NAME TIMEOUT LINE
  python3 - "$D/$1.ctl" "$2" "$3" <<'PY'
import base64, socket, sys, time
path, timeout, line = sys.argv[1], float(sys.argv[2]), sys.argv[3]
s = socket.socket(socket.AF_UNIX)
s.settimeout(timeout + 30)
s.connect(path)
s.sendall(line.encode() + b"\n")
buf = b""
while True:
    try:
        chunk = s.recv(65536)
    except socket.timeout:
        sys.exit("rxe-guest: the guest agent did not answer")
    if not chunk:
        sys.exit("rxe-guest: the guest closed its control port")
    buf += chunk
    lines = buf.split(b"\n")
    for i, l in enumerate(lines[:-1]):
        if l.startswith(b"== "):
            body = b"".join(lines[:i])
            word = l[3:].decode(errors="replace")
            if word.startswith("rc="):
                sys.stdout.write(base64.b64decode(body).decode(errors="replace"))
                sys.exit(int(word[3:]))
            if word.startswith("unknown command"):
                sys.exit("rxe-guest: the guest agent got an " + word)
            print(word)
            sys.exit(0)
PY
}

boot() {
  local name=$1 tap ip mac
  read -r tap ip mac <<<"$(guest_params "$name")"
  build
  stop "$name" 2>/dev/null || true
  rm -f "$D/$name.ctl" "$D/$name.console" "$D/$name.pid"
  in_ns qemu-system-x86_64 -accel tcg,thread=single -cpu max -m 512 -smp "${RXE_SMP:-2}" \
    -display none -monitor none -no-reboot -daemonize -pidfile "$D/$name.pid" \
    -kernel "$D/image/vmlinuz" -initrd "$D/image/initramfs.gz" \
    -append "console=ttyS0 quiet panic=-1 guest_ip=$ip" \
    -serial "file:$D/$name.console" \
    -chardev "socket,id=ctl,path=$D/$name.ctl,server=on,wait=off" -serial chardev:ctl \
    -netdev "tap,id=n0,ifname=$tap,script=no,downscript=no" \
    -device "virtio-net-pci,netdev=n0,mac=$mac"
  local t=0
  until grep -q "== guest ready" "$D/$name.console" 2>/dev/null; do
    sleep 0.5; t=$((t + 1))
    if grep -q "Kernel panic" "$D/$name.console" 2>/dev/null || ! kill -0 "$(cat "$D/$name.pid" 2>/dev/null)" 2>/dev/null; then
      tail -5 "$D/$name.console" >&2; die "$name did not boot (console: $D/$name.console)"
    fi
    [ $t -lt 240 ] || { cat "$D/$name.console" >&2; die "$name did not come up in 120 s"; }
  done
  sleep 0.3
  ctl "$name" 10 PING >/dev/null || die "$name: no control agent"
  echo "rxe-guest: $name up ($ip, $mac, rxe0 $(grep -o 'active_mtu.*' "$D/$name.console" | head -1 | tr -s '\t ' ' '))"
}

start() { # NAME ID SCRIPT; fails unless the agent says it started ID
  local said
  said=$(ctl "$1" 10 "START $2 $(printf '%s\n' "$3" | base64 -w0)") || return 1
  [ "$said" = "started $2" ] || { echo "rxe-guest: $1 did not start $2: '$said'" >&2; return 1; }
}

wait_for() { # NAME ID [SECS]
  ctl "$1" "${3:-120}" "WAIT $2 ${3:-120}"
}

stop() {
  local name=$1 pid
  [ -f "$D/$name.pid" ] || return 0
  pid=$(cat "$D/$name.pid")
  if [ -S "$D/$name.ctl" ]; then ctl "$name" 5 POWEROFF >/dev/null 2>&1 || true; fi
  for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill "$pid" 2>/dev/null || true
  rm -f "$D/$name.pid" "$D/$name.ctl"
}

case "${1:-}" in
  build) build ;;
  agent-check) agent_check ;;
  net-up) net_up ;;
  net-down) net_down ;;
  boot) boot "${2:?NAME}" ;;
  start) start "${2:?NAME}" "${3:?ID}" "${4:?SCRIPT}" ;;
  wait) wait_for "${2:?NAME}" "${3:?ID}" "${4:-120}" ;;
  run) id=r$$; start "${2:?NAME}" "$id" "${3:?SCRIPT}"; wait_for "$2" "$id" "${4:-120}" ;;
  stop) stop "${2:?NAME}" ;;
  down) stop rxe0; stop rxe1; net_down ;;
  *) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
