// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * rsnic's XDP program for DPDK's net_af_xdp PMD (`xdp_prog=` devarg).
 *
 * It shares a kernel interface between rsnic and the kernel, as a hardware
 * RoCE NIC shares its port with the host stack: IPv4 UDP frames to the
 * RoCEv2 port (4791, IBA Annex A17) are redirected to the AF_XDP socket
 * bound to the receiving queue; every other frame (ARP, ICMP, TCP, IPv6,
 * IPv4 fragments, other UDP) is returned to the kernel with XDP_PASS.
 *
 * Contract with the PMD (DPDK 22.11 doc/guides/nics/af_xdp.rst, "xdp_prog"):
 * the object holds one XDP program and a BPF_MAP_TYPE_XSKMAP named
 * `xsks_map`; the PMD links the program to the interface and puts the socket
 * of queue q at key q. bpf_redirect_map() with XDP_PASS in its flags returns
 * XDP_PASS when the key has no socket (kernel >= 5.3, Documentation/bpf/
 * map_xskmap.rst), so a queue without rsnic still feeds the kernel.
 *
 * Built by nic/dpdk/build.rs with `clang -O2 -target bpf` against Debian's
 * libbpf headers (libbpf-dev); the object is embedded in the binaries.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define ROCEV2_UDP_PORT 4791
/* IPv4 flags/fragment-offset field: MF flag and the 13-bit offset. */
#define IP_MF_OFFSET 0x3fff

/* One socket per receive queue; 64 queues cover common NICs. */
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
} xsks_map SEC(".maps");

SEC("xdp")
int rsnic_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip;
	struct udphdr *udp;
	__u32 ihl;

	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return XDP_PASS;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end || ip->version != 4 || ip->protocol != IPPROTO_UDP)
		return XDP_PASS;
	/* Fragments go to the kernel, which reassembles them. */
	if (ip->frag_off & bpf_htons(IP_MF_OFFSET))
		return XDP_PASS;
	ihl = ip->ihl * 4;
	if (ihl < sizeof(*ip))
		return XDP_PASS;
	udp = (void *)ip + ihl;
	if ((void *)(udp + 1) > end || udp->dest != bpf_htons(ROCEV2_UDP_PORT))
		return XDP_PASS;
	return bpf_redirect_map(&xsks_map, ctx->rx_queue_index, XDP_PASS);
}

char _license[] SEC("license") = "Dual MIT/GPL";
