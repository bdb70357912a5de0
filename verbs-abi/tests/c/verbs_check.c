/*
 * The ibverbs ABI of librsnic_verbs.so seen from C, as a program sees it:
 * compiled against the system's <infiniband/verbs.h>, linked with
 * -libverbs, run under LD_PRELOAD (scripts/verbs-abi.sh, "abi" part) on a
 * looped-back port (net_ring0: the NIC talks to itself, so two QPs of one
 * process connect to each other through the wire path, ARP included).
 *
 * Checks (issue 22, item 5; issue 40): NULL and foreign pointers, UD/XRC QPs, SRQs,
 * attribute masks of ibv_modify_qp, posting before RTR, a wrong lkey
 * (IBV_WC_LOC_PROT_ERR) and a wrong rkey (IBV_WC_REM_ACCESS_ERR), data of
 * WRITE / READ / SEND with immediate / both atomics, scatter/gather lists
 * (WRITE and SEND gathered, receives and READs scattered), completion events, and
 * N create/destroy cycles of every object with the process's RSS flat.
 * Exits 0 only if every check passed; prints one line per check.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "check.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;

static volatile sig_atomic_t alarms;
static void on_alarm(int sig)
{
	(void)sig;
	alarms++;
}

static long rss_kib(void)
{
	long pages = 0, resident = 0;
	FILE *f = fopen("/proc/self/statm", "r");
	if (!f)
		return -1;
	if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
		resident = -1;
	fclose(f);
	return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

struct pair {
	struct ibv_cq *cq;
	struct ibv_qp *a, *b;
};

static struct ibv_qp *rc_qp2(struct ibv_cq *scq, struct ibv_cq *rcq)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = scq, .recv_cq = rcq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	return ibv_create_qp(pd, &ia);
}

static struct ibv_qp *rc_qp(struct ibv_cq *cq)
{
	return rc_qp2(cq, cq);
}

/* An RC QP whose work requests take up to `sge` SGEs each way. */
static struct ibv_qp *rc_qp_sge(struct ibv_cq *cq, uint32_t sge)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = sge, .max_recv_sge = sge },
	};
	return ibv_create_qp(pd, &ia);
}

static int to_init(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
						    IBV_ACCESS_REMOTE_ATOMIC };
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static int to_rtr(struct ibv_qp *qp, uint32_t dest, uint32_t rq_psn)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = dest,
				 .rq_psn = rq_psn, .max_dest_rd_atomic = 4, .min_rnr_timer = 12,
				 .ah_attr = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid, .hop_limit = 1 } } };
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static int to_rts(struct ibv_qp *qp, uint32_t sq_psn)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTS, .sq_psn = sq_psn, .timeout = 14, .retry_cnt = 7,
				 .rnr_retry = 7, .max_rd_atomic = 4 };
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					     IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
}

static int connect_pair(struct pair *p)
{
	p->cq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
	p->a = rc_qp(p->cq);
	p->b = rc_qp(p->cq);
	if (!p->cq || !p->a || !p->b)
		return -1;
	if (to_init(p->a) || to_init(p->b) || to_rtr(p->a, p->b->qp_num, 200) || to_rtr(p->b, p->a->qp_num, 100) ||
	    to_rts(p->a, 100) || to_rts(p->b, 200))
		return -1;
	return 0;
}

static void destroy_pair(struct pair *p)
{
	ibv_destroy_qp(p->a);
	ibv_destroy_qp(p->b);
	ibv_destroy_cq(p->cq);
}

/* One completion within 5 s (never hangs). */
static int wait_wc(struct ibv_cq *cq, struct ibv_wc *wc)
{
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n != 0)
			return n;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 5)
			return 0;
		sched_yield();
	}
}

static int post(struct ibv_qp *qp, enum ibv_wr_opcode op, struct ibv_mr *l, size_t off, uint32_t len,
		uint64_t raddr, uint32_t rkey, uint32_t lkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)l->addr + off, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = op, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(qp, &wr, &bad);
}

/* UD and UC (issue 40, item 4) on one port, through the NIC's loopback:
 * Q_Keys and the modify masks of each service, address handles, the
 * 40-byte GRH in front of a UD receive, datagrams of a wrong Q_Key dropped,
 * a reply through ibv_create_ah_from_wc, the path MTU as a datagram's
 * limit; UC SEND and WRITE with immediate, READ refused. */
static void ud_uc_checks(struct ibv_mr *m0, struct ibv_mr *m1, char *b0, char *b1)
{
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_qp_init_attr ua = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
				       .cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 2,
						.max_recv_sge = 2, .max_inline_data = 64 } };
	struct ibv_qp *u1 = ibv_create_qp(pd, &ua), *u2 = ibv_create_qp(pd, &ua);
	CHECK(cq && u1 && u2 && u1->qp_type == IBV_QPT_UD && u1->qp_num != u2->qp_num, "two UD QPs");
	if (!cq || !u1 || !u2)
		return;
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1, .qkey = 0x11111111,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
	errno = 0;
	CHECK(ibv_modify_qp(u1, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT) == EINVAL,
	      "UD to INIT without a Q_Key: EINVAL");
	CHECK(ibv_modify_qp(u1, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY |
					    IBV_QP_ACCESS_FLAGS) == EINVAL,
	      "UD to INIT with access flags (not a UD attribute): EINVAL");
	int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
	CHECK(ibv_modify_qp(u1, &a, mask) == 0 && ibv_modify_qp(u2, &a, mask) == 0, "UD to INIT with a Q_Key");
	a.qp_state = IBV_QPS_RTR;
	a.dest_qp_num = 5;
	CHECK(ibv_modify_qp(u1, &a, IBV_QP_STATE | IBV_QP_DEST_QPN) == EINVAL,
	      "UD to RTR with a destination QPN (a connected QP's attribute): EINVAL");
	CHECK(ibv_modify_qp(u1, &a, IBV_QP_STATE) == 0 && ibv_modify_qp(u2, &a, IBV_QP_STATE) == 0, "UD to RTR");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 1;
	CHECK(ibv_modify_qp(u1, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0 &&
		      ibv_modify_qp(u2, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0,
	      "UD to RTS (no retry attributes)");

	struct ibv_ah_attr aa = { .is_global = 0, .port_num = 1 };
	errno = 0;
	CHECK(ibv_create_ah(pd, &aa) == NULL && errno == EINVAL, "create_ah without a GRH (RoCE needs one): NULL/EINVAL");
	aa.is_global = 1;
	aa.grh.dgid = gid;
	aa.grh.hop_limit = 64;
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	CHECK(ah != NULL && ah->pd == pd, "create_ah to our own GID");

	struct ibv_wc wc;
	struct ibv_sge rs = { .addr = (uintptr_t)b1, .length = 40 + 256, .lkey = m1->lkey };
	struct ibv_recv_wr r = { .wr_id = 901, .sg_list = &rs, .num_sge = 1 }, *rb;
	struct ibv_sge ss[2] = { { .addr = (uintptr_t)b0, .length = 100, .lkey = m0->lkey },
				 { .addr = (uintptr_t)b0 + 1000, .length = 28, .lkey = m0->lkey } };
	struct ibv_send_wr s = { .wr_id = 902, .sg_list = ss, .num_sge = 2, .opcode = IBV_WR_SEND_WITH_IMM,
				 .send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(0x5eed) }, *sb;
	s.wr.ud.ah = ah;
	s.wr.ud.remote_qpn = u2->qp_num;
	s.wr.ud.remote_qkey = 0x22222222; /* wrong: u2 drops it */
	for (int i = 0; i < 1128; i++)
		b0[i] = (char)(i * 7 + 3);
	memset(b1, 0, 40 + 256);
	int ok = ibv_post_recv(u2, &r, &rb) == 0 && ibv_post_send(u1, &s, &sb) == 0 && wait_wc(cq, &wc) == 1 &&
		 wc.wr_id == 902 && wc.status == IBV_WC_SUCCESS;
	s.wr.ud.remote_qkey = 0x11111111;
	s.wr_id = 903;
	ok = ok && ibv_post_send(u1, &s, &sb) == 0;
	int got_send = 0, got_recv = 0;
	for (int i = 0; ok && i < 2 && wait_wc(cq, &wc) == 1; i++) {
		if (wc.wr_id == 903 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND)
			got_send = 1;
		if (wc.wr_id == 901 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV)
			got_recv = wc.byte_len == 40 + 128 && (wc.wc_flags & IBV_WC_GRH) &&
				   (wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) == 0x5eed &&
				   wc.src_qp == u1->qp_num && wc.qp_num == u2->qp_num;
	}
	ok = ok && got_send && got_recv && !memcmp(b1 + 40, b0, 100) && !memcmp(b1 + 140, b0 + 1000, 28);
	/* RoCE v2 over IPv4: the GRH area holds the IPv4 header in its last 20
	 * bytes (rdma-core's ibv_init_ah_from_wc reads it there). */
	ok = ok && (unsigned char)b1[20] == 0x45 && !memcmp(b1 + 32, gid.raw + 12, 4) && !memcmp(b1 + 36, gid.raw + 12, 4);
	CHECK(ok, "UD SEND with immediate of 2 SGEs: the datagram of a wrong Q_Key dropped, the next received "
		  "behind a 40-byte GRH (IPv4 header in its last 20 bytes), src_qp, IBV_WC_GRH (send %d, recv %d)",
	      got_send, got_recv);

	struct ibv_ah *back = ok ? ibv_create_ah_from_wc(pd, &wc, (struct ibv_grh *)b1, 1) : NULL;
	struct ibv_ah_attr fa;
	memset(&fa, 0, sizeof(fa));
	CHECK(back && ibv_init_ah_from_wc(ctx, 1, &wc, (struct ibv_grh *)b1, &fa) == 0 && fa.is_global &&
		      !memcmp(fa.grh.dgid.raw, gid.raw, 16),
	      "create_ah_from_wc / init_ah_from_wc: the sender's GID");
	struct ibv_wc nogrh = wc;
	nogrh.wc_flags &= ~IBV_WC_GRH;
	errno = 0;
	CHECK(ibv_create_ah_from_wc(pd, &nogrh, (struct ibv_grh *)b1, 1) == NULL && errno == EINVAL,
	      "create_ah_from_wc of a completion without IBV_WC_GRH: NULL/EINVAL");
	if (back) {
		/* The reply: inline, to the address handle of the request. */
		rs.addr = (uintptr_t)b1 + 1024;
		r.wr_id = 904;
		char word[] = "pong";
		struct ibv_sge is = { .addr = (uintptr_t)word, .length = 5 };
		struct ibv_send_wr ps = { .wr_id = 905, .sg_list = &is, .num_sge = 1, .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE };
		ps.wr.ud.ah = back;
		ps.wr.ud.remote_qpn = wc.src_qp;
		ps.wr.ud.remote_qkey = 0x11111111;
		got_recv = got_send = 0;
		ok = ibv_post_recv(u1, &r, &rb) == 0 && ibv_post_send(u2, &ps, &sb) == 0;
		for (int i = 0; ok && i < 2 && wait_wc(cq, &wc) == 1; i++) {
			got_send |= wc.wr_id == 905 && wc.status == IBV_WC_SUCCESS;
			got_recv |= wc.wr_id == 904 && wc.status == IBV_WC_SUCCESS && wc.byte_len == 45 &&
				    wc.src_qp == u2->qp_num && !memcmp(b1 + 1024 + 40, "pong", 5);
		}
		CHECK(got_send && got_recv, "the inline reply through the AH made from the completion");
		CHECK(ibv_destroy_ah(back) == 0, "destroy_ah");
	}
	struct ibv_port_attr pa;
	ibv_query_port(ctx, 1, &pa);
	int mtu = 128 << pa.active_mtu;
	struct ibv_sge big = { .addr = (uintptr_t)b0, .length = (uint32_t)mtu + 1, .lkey = m0->lkey };
	s.sg_list = &big;
	s.num_sge = 1;
	sb = NULL;
	CHECK(ibv_post_send(u1, &s, &sb) == EINVAL && sb == &s, "UD SEND of the path MTU (%d) + 1 bytes: EINVAL", mtu);
	s.sg_list = ss;
	s.opcode = IBV_WR_RDMA_WRITE;
	CHECK(ibv_post_send(u1, &s, &sb) == EINVAL, "RDMA WRITE on a UD QP: EINVAL");
	CHECK(ibv_destroy_qp(u1) == 0 && ibv_destroy_qp(u2) == 0 && ibv_destroy_ah(ah) == 0, "UD teardown");

	/* UC: connected, no ACKs; SEND and WRITE, never READ or atomics. */
	struct ibv_qp_init_attr ca = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UC,
				       .cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *c1 = ibv_create_qp(pd, &ca), *c2 = ibv_create_qp(pd, &ca);
	CHECK(c1 && c2 && c1->qp_type == IBV_QPT_UC, "two UC QPs");
	if (!c1 || !c2)
		return;
	struct ibv_qp_attr ia = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				  .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
	mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
	ok = ibv_modify_qp(c1, &ia, mask) == 0 && ibv_modify_qp(c2, &ia, mask) == 0;
	struct ibv_qp_attr ra = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .rq_psn = 7,
				  .min_rnr_timer = 12,
				  .ah_attr = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid, .hop_limit = 1 } } };
	mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
	ra.dest_qp_num = c2->qp_num;
	CHECK(ok && ibv_modify_qp(c1, &ra, mask | IBV_QP_MIN_RNR_TIMER) == EINVAL,
	      "UC to RTR with an RNR timer (an RC attribute): EINVAL");
	ok = ibv_modify_qp(c1, &ra, mask) == 0;
	ra.dest_qp_num = c1->qp_num;
	ok = ok && ibv_modify_qp(c2, &ra, mask) == 0;
	struct ibv_qp_attr ta = { .qp_state = IBV_QPS_RTS, .sq_psn = 7, .retry_cnt = 7 };
	CHECK(ok && ibv_modify_qp(c1, &ta, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_RETRY_CNT) == EINVAL,
	      "UC to RTS with a retry count: EINVAL");
	ok = ibv_modify_qp(c1, &ta, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0 &&
	     ibv_modify_qp(c2, &ta, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0;
	CHECK(ok, "UC connected (INIT, RTR, RTS)");
	memset(b1 + 2048, 0, 3000);
	rs = (struct ibv_sge){ .addr = (uintptr_t)b1 + 6000, .length = 16, .lkey = m1->lkey };
	r = (struct ibv_recv_wr){ .wr_id = 910, .sg_list = &rs, .num_sge = 1 };
	struct ibv_sge ws = { .addr = (uintptr_t)b0, .length = 3000, .lkey = m0->lkey };
	struct ibv_send_wr w = { .wr_id = 911, .sg_list = &ws, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
				 .send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(77) };
	w.wr.rdma.remote_addr = (uintptr_t)b1 + 2048;
	w.wr.rdma.rkey = m1->rkey;
	got_send = got_recv = 0;
	ok = ibv_post_recv(c2, &r, &rb) == 0 && ibv_post_send(c1, &w, &sb) == 0;
	for (int i = 0; ok && i < 2 && wait_wc(cq, &wc) == 1; i++) {
		got_send |= wc.wr_id == 911 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE;
		got_recv |= wc.wr_id == 910 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
			    ntohl(wc.imm_data) == 77 && wc.byte_len == 3000 && wc.src_qp == 0;
	}
	CHECK(got_send && got_recv && !memcmp(b1 + 2048, b0, 3000),
	      "UC WRITE with immediate of 3000 B (3 packets): data placed, RECV_RDMA_WITH_IMM");
	w.opcode = IBV_WR_RDMA_READ;
	sb = NULL;
	CHECK(ibv_post_send(c1, &w, &sb) == EINVAL && sb == &w, "RDMA READ on a UC QP: EINVAL, bad_wr set");
	w.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	CHECK(ibv_post_send(c1, &w, &sb) == EINVAL, "an atomic on a UC QP: EINVAL");
	CHECK(ibv_destroy_qp(c1) == 0 && ibv_destroy_qp(c2) == 0 && ibv_destroy_cq(cq) == 0, "UC teardown");
}

int main(int argc, char **argv)
{
	long cycles = argc > 1 ? atol(argv[1]) : 100000;
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n == 1 && !strcmp(ibv_get_device_name(list[0]), "rsnic0"), "one device, rsnic0 (n=%d)", n);
	if (!list || n < 1)
		return 1;
	ctx = ibv_open_device(list[0]);
	CHECK(ctx != NULL, "ibv_open_device");
	if (!ctx)
		return 1;
	ibv_free_device_list(list);
	{
		/* The library's threads in the program: the engine and DPDK's
		 * interrupt thread, no idle EAL worker lcores (issue 40, item 8). */
		char path[300], comm[64], names[512] = "";
		int threads = 0, workers = 0;
		DIR *d = opendir("/proc/self/task");
		for (struct dirent *e; d && (e = readdir(d));) {
			if (e->d_name[0] == '.')
				continue;
			snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
			FILE *f = fopen(path, "r");
			if (!f)
				continue;
			if (fgets(comm, sizeof(comm), f)) {
				comm[strcspn(comm, "\n")] = 0;
				workers += !strncmp(comm, "rte-worker", 10);
				if (strlen(names) + strlen(comm) + 2 < sizeof(names)) {
					strcat(names, " ");
					strcat(names, comm);
				}
			}
			fclose(f);
			threads++;
		}
		if (d)
			closedir(d);
		CHECK(threads == 3 && workers == 0, "3 threads after ibv_open_device: the program's, the engine, the EAL's "
						    "interrupt thread (%d:%s)",
		      threads, names);
	}
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0 && gid.raw[10] == 0xff && gid.raw[11] == 0xff,
	      "GID 0 is IPv4-mapped");
	struct ibv_gid_entry ge;
	CHECK(ibv_query_gid_ex(ctx, 1, 0, &ge, 0) == 0 && ge.gid_type == IBV_GID_TYPE_ROCE_V2, "GID 0 is RoCE v2");
	CHECK(ibv_query_gid(ctx, 1, 1, &gid) == -1 && errno == EINVAL, "GID 1 does not exist: -1/EINVAL");
	ibv_query_gid(ctx, 1, 0, &gid);
	struct ibv_port_attr pa;
	CHECK(ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE &&
		      pa.link_layer == IBV_LINK_LAYER_ETHERNET, "port 1 ACTIVE, Ethernet");
	CHECK(ibv_query_port(ctx, 2, &pa) == EINVAL, "port 2: EINVAL");

	/* NULL and foreign pointers: EINVAL (rdma-core would crash on most). */
	char foreign[512];
	memset(foreign, 0x5a, sizeof(foreign));
	errno = 0;
	CHECK(ibv_alloc_pd(NULL) == NULL && errno == EINVAL, "alloc_pd(NULL): NULL/EINVAL");
	CHECK(ibv_dealloc_pd((struct ibv_pd *)foreign) == EINVAL, "dealloc_pd(foreign): EINVAL");
	CHECK(ibv_dereg_mr((struct ibv_mr *)foreign) == EINVAL, "dereg_mr(foreign): EINVAL");
	CHECK(ibv_destroy_cq((struct ibv_cq *)foreign) == EINVAL, "destroy_cq(foreign): EINVAL");
	CHECK(ibv_destroy_qp((struct ibv_qp *)foreign) == EINVAL, "destroy_qp(foreign): EINVAL");
	CHECK(ibv_destroy_qp(NULL) == EINVAL, "destroy_qp(NULL): EINVAL");
	CHECK(ibv_close_device((struct ibv_context *)foreign) == -1 && errno == EINVAL, "close_device(foreign): -1/EINVAL");

	pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL, "alloc_pd");
	static char buf[2][1 << 16] __attribute__((aligned(64)));
	errno = 0;
	CHECK(ibv_reg_mr(pd, buf[0], 0, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EINVAL, "reg_mr of 0 bytes: EINVAL");
	errno = 0;
	CHECK(ibv_reg_mr(pd, buf[0], 64, IBV_ACCESS_REMOTE_WRITE) == NULL && errno == EINVAL,
	      "reg_mr REMOTE_WRITE without LOCAL_WRITE: EINVAL");
	errno = 0;
	CHECK(ibv_reg_mr_iova2(pd, buf[0], 64, 0x1000, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EINVAL,
	      "reg_mr_iova2 with iova != addr: EINVAL");
	int all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	struct ibv_mr *m0 = ibv_reg_mr(pd, buf[0], sizeof(buf[0]), all);
	struct ibv_mr *m1 = ibv_reg_mr(pd, buf[1], sizeof(buf[1]), all);
	CHECK(m0 && m1 && m0->addr == buf[0] && m0->length == sizeof(buf[0]), "reg_mr over the caller's buffers");
	CHECK(ibv_dealloc_pd(pd) == EBUSY, "dealloc_pd with regions: EBUSY");

	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(cq != NULL, "create_cq");
	errno = 0;
	CHECK(ibv_create_cq(ctx, 0, NULL, NULL, 0) == NULL && errno == EINVAL, "create_cq of 0 entries: EINVAL");
	struct ibv_device_attr da;
	CHECK(ibv_query_device(ctx, &da) == 0 && da.vendor_id == 0xFFFFFF && da.vendor_part_id == 0,
	      "vendor_id 0xFFFFFF, vendor_part_id 0, as Linux rxe (%#x, %u)", da.vendor_id, da.vendor_part_id);
	errno = 0;
	CHECK(ibv_create_cq(ctx, da.max_cqe + 1, NULL, NULL, 0) == NULL && errno == EINVAL,
	      "create_cq of max_cqe + 1 (%d) entries: EINVAL", da.max_cqe + 1);
	struct ibv_cq *big = ibv_create_cq(ctx, da.max_cqe, NULL, NULL, 0);
	CHECK(big != NULL && ibv_destroy_cq(big) == 0, "create_cq of max_cqe entries");
	errno = 0;
	CHECK(ctx->num_comp_vectors == 1 && ibv_create_cq(ctx, 16, NULL, NULL, ctx->num_comp_vectors) == NULL &&
		      errno == EINVAL,
	      "create_cq on comp_vector num_comp_vectors (%d): EINVAL", ctx->num_comp_vectors);
	errno = 0;
	CHECK(ibv_create_cq(ctx, 16, NULL, NULL, -1) == NULL && errno == EINVAL, "create_cq on comp_vector -1: EINVAL");
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_XRC_SEND,
				       .cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
	errno = 0;
	CHECK(ibv_create_qp(pd, &ia) == NULL && errno == EOPNOTSUPP, "XRC QP: NULL/EOPNOTSUPP");
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_sge = 33;
	errno = 0;
	CHECK(ibv_create_qp(pd, &ia) == NULL && errno == EINVAL, "33 send SGEs (rxe's limit is 32): NULL/EINVAL");
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 33;
	errno = 0;
	CHECK(ibv_create_qp(pd, &ia) == NULL && errno == EINVAL, "33 receive SGEs: NULL/EINVAL");
	{
		struct ibv_device_attr da;
		CHECK(ibv_query_device(ctx, &da) == 0 && da.max_sge == 32 && da.max_sge_rd == 32,
		      "query_device: max_sge 32, max_sge_rd 32");
		ia.cap.max_send_sge = 32;
		ia.cap.max_recv_sge = 32;
		struct ibv_qp *q32 = ibv_create_qp(pd, &ia);
		CHECK(q32 && ia.cap.max_send_sge == 32 && ia.cap.max_recv_sge == 32, "32 SGEs each way: granted");
		if (q32)
			ibv_destroy_qp(q32);
	}
	{
		/* Shared receive queues: attributes and their refusals. */
		struct ibv_srq_init_attr sa = { .srq_context = (void *)0x77, .attr = { .max_wr = 8, .max_sge = 33 } };
		errno = 0;
		CHECK(ibv_create_srq(pd, &sa) == NULL && errno == EINVAL, "SRQ of 33 SGEs: NULL/EINVAL");
		sa.attr.max_sge = 2;
		sa.attr.max_wr = 0;
		errno = 0;
		CHECK(ibv_create_srq(pd, &sa) == NULL && errno == EINVAL, "SRQ of 0 WRs: NULL/EINVAL");
		sa.attr.max_wr = 8;
		struct ibv_srq *srq = ibv_create_srq(pd, &sa);
		struct ibv_srq_attr qa = { 0 };
		CHECK(srq && srq->srq_context == (void *)0x77 && srq->pd == pd && sa.attr.max_wr == 8 &&
			      sa.attr.max_sge == 2 && ibv_query_srq(srq, &qa) == 0 && qa.max_wr == 8 && qa.max_sge == 2 &&
			      qa.srq_limit == 0,
		      "create_srq, query_srq: 8 WRs, 2 SGEs, not armed");
		struct ibv_srq_attr lim = { .srq_limit = 9 };
		CHECK(srq && ibv_modify_srq(srq, &lim, IBV_SRQ_LIMIT) == EINVAL, "modify_srq limit above max_wr: EINVAL");
		lim.max_wr = 16;
		CHECK(srq && ibv_modify_srq(srq, &lim, IBV_SRQ_MAX_WR) == EINVAL, "modify_srq resize (no SRQ_RESIZE): EINVAL");
		lim.srq_limit = 3;
		CHECK(srq && ibv_modify_srq(srq, &lim, IBV_SRQ_LIMIT) == 0 && ibv_query_srq(srq, &qa) == 0 &&
			      qa.srq_limit == 3,
		      "modify_srq limit 3: armed");
		struct ibv_sge rs[3];
		struct ibv_recv_wr r = { .wr_id = 1, .sg_list = rs, .num_sge = 3 }, *rb = NULL;
		CHECK(srq && ibv_post_srq_recv(srq, &r, &rb) == EINVAL && rb == &r, "post_srq_recv with 3 SGEs: EINVAL, bad_wr");
		CHECK(srq && ibv_destroy_srq(srq) == 0, "destroy_srq");
	}
	CHECK(ibv_dealloc_pd(pd) == EBUSY, "dealloc_pd in use: EBUSY");

	/* The life cycle and its masks. */
	struct ibv_qp *qp = rc_qp(cq);
	CHECK(qp && qp->state == IBV_QPS_RESET, "create_qp: RC, in RESET");
	CHECK(ibv_destroy_cq(cq) == EBUSY, "destroy_cq with a QP: EBUSY");
	struct ibv_recv_wr rwr = { .wr_id = 1 }, *rbad = NULL;
	CHECK(ibv_post_recv(qp, &rwr, &rbad) == EINVAL && rbad == &rwr, "post_recv in RESET: EINVAL, bad_wr set");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PORT) == EINVAL, "INIT without PKEY_INDEX/ACCESS_FLAGS: EINVAL");
	a.qp_state = IBV_QPS_RTS;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == EINVAL, "RESET -> RTS: EINVAL");
	CHECK(to_init(qp) == 0 && qp->state == IBV_QPS_INIT, "RESET -> INIT");
	CHECK(post(qp, IBV_WR_RDMA_WRITE, m0, 0, 8, (uintptr_t)buf[1], m1->rkey, m0->lkey) == EINVAL,
	      "post_send before RTR/RTS: EINVAL");
	a.qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == EINVAL, "RTR without AV/DEST_QPN/...: EINVAL");
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qia;
	CHECK(ibv_query_qp(qp, &qa, IBV_QP_STATE, &qia) == 0 && qa.qp_state == IBV_QPS_INIT && qia.cap.max_send_wr == 64,
	      "query_qp: INIT, caps");
	{
		/* ibv_modify_qp(3): EINVAL for a value the device cannot take,
		 * not a silent clamp. */
		struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = qp->qp_num,
					 .rq_psn = 1, .max_dest_rd_atomic = da.max_qp_rd_atom + 1, .min_rnr_timer = 12,
					 .ah_attr = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid, .hop_limit = 1 } } };
		int rm = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
		CHECK(ibv_modify_qp(qp, &r, rm) == EINVAL && qp->state == IBV_QPS_INIT,
		      "RTR with max_dest_rd_atomic max_qp_rd_atom + 1 (%d): EINVAL, still INIT", da.max_qp_rd_atom + 1);
		r.max_dest_rd_atomic = da.max_qp_rd_atom;
		CHECK(ibv_modify_qp(qp, &r, rm) == 0, "RTR with max_dest_rd_atomic max_qp_rd_atom (%d)", da.max_qp_rd_atom);
		struct ibv_qp_attr t = { .qp_state = IBV_QPS_RTS, .sq_psn = 1, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7,
					 .max_rd_atomic = da.max_qp_init_rd_atom + 1 };
		int tm = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			 IBV_QP_MAX_QP_RD_ATOMIC;
		CHECK(ibv_modify_qp(qp, &t, tm) == EINVAL && qp->state == IBV_QPS_RTR,
		      "RTS with max_rd_atomic max_qp_init_rd_atom + 1 (%d): EINVAL, still RTR", da.max_qp_init_rd_atom + 1);
		t.max_rd_atomic = da.max_qp_init_rd_atom;
		CHECK(ibv_modify_qp(qp, &t, tm) == 0 && ibv_query_qp(qp, &qa, IBV_QP_MAX_QP_RD_ATOMIC, &qia) == 0 &&
			      qa.max_rd_atomic == da.max_qp_init_rd_atom && qa.max_dest_rd_atomic == da.max_qp_rd_atom,
		      "RTS with max_rd_atomic max_qp_init_rd_atom; query_qp gives both back");
	}
	CHECK(ibv_destroy_qp(qp) == 0, "destroy_qp");
	CHECK(ibv_destroy_qp(qp) == EINVAL, "destroy_qp twice: EINVAL");

	/* Data through the wire path (the port loops back). */
	struct pair p;
	CHECK(connect_pair(&p) == 0, "two RC QPs connected to each other (our own GID: our own MAC)");
	struct ibv_wc wc;
	memcpy(buf[0], "hello, rsnic verbs", 19);
	CHECK(post(p.a, IBV_WR_RDMA_WRITE, m0, 0, 19, (uintptr_t)buf[1] + 100, m1->rkey, m0->lkey) == 0 &&
		      wait_wc(p.cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE &&
		      !memcmp(buf[1] + 100, "hello, rsnic verbs", 19),
	      "RDMA WRITE: data placed");
	memcpy(buf[1] + 4096, "read me back", 13);
	CHECK(post(p.a, IBV_WR_RDMA_READ, m0, 4096, 13, (uintptr_t)buf[1] + 4096, m1->rkey, m0->lkey) == 0 &&
		      wait_wc(p.cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_READ &&
		      wc.byte_len == 13 && !memcmp(buf[0] + 4096, "read me back", 13),
	      "RDMA READ: data read");
	{
		struct ibv_sge rs = { .addr = (uintptr_t)buf[1] + 8192, .length = 64, .lkey = m1->lkey };
		struct ibv_recv_wr r = { .wr_id = 77, .sg_list = &rs, .num_sge = 1 }, *rb;
		struct ibv_sge ss = { .addr = (uintptr_t)buf[0], .length = 19, .lkey = m0->lkey };
		struct ibv_send_wr s = { .wr_id = 78, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_IMM,
					 .send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(0xabcd1234) }, *sb;
		int got_recv = 0, got_send = 0;
		if (ibv_post_recv(p.b, &r, &rb) == 0 && ibv_post_send(p.a, &s, &sb) == 0) {
			for (int i = 0; i < 2 && wait_wc(p.cq, &wc) == 1; i++) {
				if (wc.wr_id == 77 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV &&
				    (wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) == 0xabcd1234 &&
				    wc.byte_len == 19 && wc.qp_num == p.b->qp_num)
					got_recv = 1;
				if (wc.wr_id == 78 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND)
					got_send = 1;
			}
		}
		CHECK(got_recv && got_send && !memcmp(buf[1] + 8192, "hello, rsnic verbs", 19),
		      "SEND with immediate: RECV completion, imm in network order, data");
	}
	{
		uint64_t *target = (uint64_t *)(buf[1] + 16384), *old = (uint64_t *)(buf[0] + 16384);
		*target = 40;
		struct ibv_sge s = { .addr = (uintptr_t)old, .length = 8, .lkey = m0->lkey };
		struct ibv_send_wr w = { .wr_id = 5, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
					 .send_flags = IBV_SEND_SIGNALED }, *b;
		w.wr.atomic.remote_addr = (uintptr_t)target;
		w.wr.atomic.rkey = m1->rkey;
		w.wr.atomic.compare_add = 2;
		int ok1 = ibv_post_send(p.a, &w, &b) == 0 && wait_wc(p.cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS &&
			  wc.opcode == IBV_WC_FETCH_ADD && *old == 40 && *target == 42;
		w.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
		w.wr.atomic.compare_add = 42;
		w.wr.atomic.swap = 7;
		int ok2 = ibv_post_send(p.a, &w, &b) == 0 && wait_wc(p.cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS &&
			  wc.opcode == IBV_WC_COMP_SWAP && *old == 42 && *target == 7;
		CHECK(ok1 && ok2, "ATOMIC fetch-add and compare-swap");
	}
	{
		/* Two QPs of B on one SRQ: SENDs from two QPs of A take its WQEs in
		 * posting order; the limit event names the SRQ; the QPs refuse
		 * receives of their own; the SRQ refuses destroy while used. */
		struct ibv_cq *scq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
		struct ibv_srq_init_attr sa = { .attr = { .max_wr = 16, .max_sge = 1 } };
		struct ibv_srq *srq = ibv_create_srq(pd, &sa);
		struct ibv_qp_init_attr qi = { .send_cq = scq, .recv_cq = scq, .srq = srq, .qp_type = IBV_QPT_RC,
					       .cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 } };
		struct ibv_qp *a1 = rc_qp(scq), *a2 = rc_qp(scq);
		struct ibv_qp *b1 = srq ? ibv_create_qp(pd, &qi) : NULL, *b2 = srq ? ibv_create_qp(pd, &qi) : NULL;
		int ok = scq && srq && a1 && a2 && b1 && b2 && b1->srq == srq && qi.cap.max_recv_wr == 0 && !to_init(a1) &&
			 !to_init(a2) && !to_init(b1) && !to_init(b2) && !to_rtr(a1, b1->qp_num, 41) &&
			 !to_rtr(b1, a1->qp_num, 40) && !to_rtr(a2, b2->qp_num, 43) && !to_rtr(b2, a2->qp_num, 42) &&
			 !to_rts(a1, 40) && !to_rts(b1, 41) && !to_rts(a2, 42) && !to_rts(b2, 43);
		CHECK(ok, "two QPs created on an SRQ (cap.max_recv_wr 0, qp->srq set), connected");
		struct ibv_sge one = { .addr = (uintptr_t)buf[1], .length = 64, .lkey = m1->lkey };
		struct ibv_recv_wr own = { .wr_id = 9, .sg_list = &one, .num_sge = 1 }, *rb = NULL;
		CHECK(b1 && ibv_post_recv(b1, &own, &rb) == EINVAL && rb == &own, "post_recv on a QP of an SRQ: EINVAL");
		struct ibv_sge rs[4];
		struct ibv_recv_wr r[4];
		for (int i = 0; i < 4; i++) {
			rs[i] = (struct ibv_sge){ .addr = (uintptr_t)buf[1] + 30000 + i * 1000, .length = 1000, .lkey = m1->lkey };
			r[i] = (struct ibv_recv_wr){ .wr_id = 300 + i, .sg_list = &rs[i], .num_sge = 1, .next = i < 3 ? &r[i + 1] : NULL };
		}
		struct ibv_srq_attr lim = { .srq_limit = 3 };
		ok = ok && ibv_post_srq_recv(srq, &r[0], &rb) == 0 && ibv_modify_srq(srq, &lim, IBV_SRQ_LIMIT) == 0;
		memcpy(buf[0] + 50000, "from a1", 8);
		memcpy(buf[0] + 50100, "from a2", 8);
		int got = 0;
		if (ok) {
			struct ibv_sge s1 = { .addr = (uintptr_t)buf[0] + 50000, .length = 8, .lkey = m0->lkey };
			struct ibv_sge s2 = { .addr = (uintptr_t)buf[0] + 50100, .length = 8, .lkey = m0->lkey };
			struct ibv_send_wr w1 = { .wr_id = 1, .sg_list = &s1, .num_sge = 1, .opcode = IBV_WR_SEND }, *sb;
			struct ibv_send_wr w2 = { .wr_id = 2, .sg_list = &s2, .num_sge = 1, .opcode = IBV_WR_SEND };
			ok = ibv_post_send(a1, &w1, &sb) == 0 && wait_wc(scq, &wc) == 1 && wc.status == IBV_WC_SUCCESS &&
			     wc.wr_id == 300 && wc.qp_num == b1->qp_num && !memcmp(buf[1] + 30000, "from a1", 8);
			ok = ok && ibv_post_send(a2, &w2, &sb) == 0 && wait_wc(scq, &wc) == 1 && wc.status == IBV_WC_SUCCESS &&
			     wc.wr_id == 301 && wc.qp_num == b2->qp_num && !memcmp(buf[1] + 31000, "from a2", 8);
			got = ok;
		}
		CHECK(got, "SENDs of two QPs take the SRQ's WQEs in posting order, each into its own buffer");
		struct ibv_async_event ae;
		int fl = fcntl(ctx->async_fd, F_GETFL);
		fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
		int found = 0;
		for (int i = 0; i < 200 && !found; i++) {
			if (ibv_get_async_event(ctx, &ae) == 0) {
				found = ae.event_type == IBV_EVENT_SRQ_LIMIT_REACHED && ae.element.srq == srq;
				ibv_ack_async_event(&ae);
			} else {
				usleep(10000);
			}
		}
		fcntl(ctx->async_fd, F_SETFL, fl);
		CHECK(found, "2 WQEs left below the limit of 3: IBV_EVENT_SRQ_LIMIT_REACHED names the SRQ");
		CHECK(srq && ibv_destroy_srq(srq) == EBUSY, "destroy_srq with QPs on it: EBUSY");
		if (b1)
			ibv_destroy_qp(b1);
		if (b2)
			ibv_destroy_qp(b2);
		if (a1)
			ibv_destroy_qp(a1);
		if (a2)
			ibv_destroy_qp(a2);
		CHECK(srq && ibv_destroy_srq(srq) == 0, "destroy_srq once its QPs are gone (its 2 WQEs discarded)");
		if (scq)
			ibv_destroy_cq(scq);
	}
	{
		/* Scatter/gather: a pair whose requests take up to 16 SGEs. */
		struct ibv_cq *gcq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
		struct ibv_qp *ga = gcq ? rc_qp_sge(gcq, 16) : NULL, *gb = gcq ? rc_qp_sge(gcq, 16) : NULL;
		int ok = ga && gb && !to_init(ga) && !to_init(gb) && !to_rtr(ga, gb->qp_num, 31) &&
			 !to_rtr(gb, ga->qp_num, 30) && !to_rts(ga, 30) && !to_rts(gb, 31);
		CHECK(ok, "a pair of QPs with 16 SGEs per request");
		struct ibv_sge sg[17];
		struct ibv_send_wr w, *b = NULL;
		/* 64 KiB WRITE gathered from 16 pieces of 4000 bytes, 96 bytes apart,
		 * backwards through buf[0]. */
		for (int i = 0; i < 65536; i++)
			buf[0][i] = (char)(i * 7 + 3);
		memset(buf[1], 0, sizeof(buf[1]));
		for (int i = 0; i < 16; i++)
			sg[i] = (struct ibv_sge){ .addr = (uintptr_t)buf[0] + (15 - i) * 4096, .length = 4000, .lkey = m0->lkey };
		w = (struct ibv_send_wr){ .wr_id = 900, .sg_list = sg, .num_sge = 16, .opcode = IBV_WR_RDMA_WRITE,
					  .send_flags = IBV_SEND_SIGNALED };
		w.wr.rdma.remote_addr = (uintptr_t)buf[1];
		w.wr.rdma.rkey = m1->rkey;
		int wok = ok && ibv_post_send(ga, &w, &b) == 0 && wait_wc(gcq, &wc) == 1 && wc.wr_id == 900 &&
			  wc.status == IBV_WC_SUCCESS && wc.byte_len == 64000;
		for (int i = 0; wok && i < 16; i++)
			wok = !memcmp(buf[1] + i * 4000, buf[0] + (15 - i) * 4096, 4000);
		CHECK(wok, "WRITE gathered from 16 SGEs: 64000 bytes placed in order");
		/* SEND of 3 pieces into a receive of 4 SGEs (the last one unused). */
		memset(buf[1], 0, sizeof(buf[1]));
		struct ibv_sge rs[4];
		for (int i = 0; i < 4; i++)
			rs[i] = (struct ibv_sge){ .addr = (uintptr_t)buf[1] + i * 8192, .length = 1000, .lkey = m1->lkey };
		struct ibv_recv_wr r = { .wr_id = 901, .sg_list = rs, .num_sge = 4 }, *rb = NULL;
		sg[0] = (struct ibv_sge){ .addr = (uintptr_t)buf[0] + 100, .length = 1500, .lkey = m0->lkey };
		sg[1] = (struct ibv_sge){ .addr = (uintptr_t)buf[0] + 30000, .length = 0, .lkey = m0->lkey };
		sg[2] = (struct ibv_sge){ .addr = (uintptr_t)buf[0] + 9000, .length = 1200, .lkey = m0->lkey };
		w = (struct ibv_send_wr){ .wr_id = 902, .sg_list = sg, .num_sge = 3, .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED };
		int got_recv = 0, got_send = 0;
		if (ok && ibv_post_recv(gb, &r, &rb) == 0 && ibv_post_send(ga, &w, &b) == 0) {
			for (int i = 0; i < 2 && wait_wc(gcq, &wc) == 1; i++) {
				got_recv |= wc.wr_id == 901 && wc.status == IBV_WC_SUCCESS && wc.byte_len == 2700;
				got_send |= wc.wr_id == 902 && wc.status == IBV_WC_SUCCESS;
			}
		}
		char want[2700];
		memcpy(want, buf[0] + 100, 1500);
		memcpy(want + 1500, buf[0] + 9000, 1200);
		int sok = got_recv && got_send && !memcmp(buf[1], want, 1000) && !memcmp(buf[1] + 8192, want + 1000, 1000) &&
			  !memcmp(buf[1] + 16384, want + 2000, 700) && buf[1][16384 + 700] == 0 && buf[1][1000] == 0;
		CHECK(sok, "SEND gathered from 3 SGEs (one empty) scattered over a 4-SGE receive: byte_len 2700, data");
		/* READ scattered into 5 SGEs. */
		for (int i = 0; i < 5; i++)
			sg[i] = (struct ibv_sge){ .addr = (uintptr_t)buf[0] + 40000 + i * 3000, .length = 2000 + i, .lkey = m0->lkey };
		memset(buf[0] + 40000, 0, 20000);
		w = (struct ibv_send_wr){ .wr_id = 903, .sg_list = sg, .num_sge = 5, .opcode = IBV_WR_RDMA_READ,
					  .send_flags = IBV_SEND_SIGNALED };
		w.wr.rdma.remote_addr = (uintptr_t)buf[1] + 30000;
		w.wr.rdma.rkey = m1->rkey;
		for (int i = 0; i < 10010; i++)
			buf[1][30000 + i] = (char)(i * 13 + 1);
		int rok = ok && ibv_post_send(ga, &w, &b) == 0 && wait_wc(gcq, &wc) == 1 && wc.wr_id == 903 &&
			  wc.status == IBV_WC_SUCCESS && wc.byte_len == 10010;
		for (int i = 0, at = 0; rok && i < 5; at += 2000 + i, i++)
			rok = !memcmp(buf[0] + 40000 + i * 3000, buf[1] + 30000 + at, 2000 + i) &&
			      buf[0][40000 + i * 3000 + 2000 + i] == 0;
		CHECK(rok, "READ scattered into 5 SGEs: byte_len 10010, data, nothing past each SGE");
		/* Refusals: more SGEs than the QP takes, an ATOMIC with two. */
		for (int i = 0; i < 17; i++)
			sg[i] = (struct ibv_sge){ .addr = (uintptr_t)buf[0], .length = 8, .lkey = m0->lkey };
		w = (struct ibv_send_wr){ .wr_id = 904, .sg_list = sg, .num_sge = 17, .opcode = IBV_WR_SEND };
		b = NULL;
		CHECK(ibv_post_send(ga, &w, &b) == EINVAL && b == &w, "post_send with 17 SGEs on a 16-SGE QP: EINVAL, bad_wr");
		r.num_sge = 17;
		r.sg_list = sg;
		rb = NULL;
		CHECK(ibv_post_recv(gb, &r, &rb) == EINVAL && rb == &r, "post_recv with 17 SGEs: EINVAL, bad_wr");
		w = (struct ibv_send_wr){ .wr_id = 905, .sg_list = sg, .num_sge = 2, .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD };
		w.wr.atomic.remote_addr = (uintptr_t)buf[1];
		w.wr.atomic.rkey = m1->rkey;
		b = NULL;
		CHECK(ibv_post_send(ga, &w, &b) == EINVAL && b == &w, "ATOMIC with 2 SGEs: EINVAL");
		CHECK(ibv_poll_cq(gcq, 1, &wc) == 0, "refused requests complete nothing");
		if (ga)
			ibv_destroy_qp(ga);
		if (gb)
			ibv_destroy_qp(gb);
		if (gcq)
			ibv_destroy_cq(gcq);
	}
	{
		/* A chain of 40 WRITEs (the library posts up to 16 per doorbell),
		 * then a chain of 20 whose 19th has a bad opcode: the 18 before it
		 * are posted, *bad names it, nothing after it is posted. */
		struct ibv_sge sg[40];
		struct ibv_send_wr w[40], *b = NULL;
		for (int i = 0; i < 40; i++) {
			uint64_t v = 1000 + i;
			memcpy(buf[0] + 20000 + 8 * i, &v, 8);
			sg[i] = (struct ibv_sge){ .addr = (uintptr_t)buf[0] + 20000 + 8 * i, .length = 8, .lkey = m0->lkey };
			w[i] = (struct ibv_send_wr){ .wr_id = 500 + i, .sg_list = &sg[i], .num_sge = 1,
						     .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
						     .next = i + 1 < 40 ? &w[i + 1] : NULL };
			w[i].wr.rdma.remote_addr = (uintptr_t)buf[1] + 20000 + 8 * i;
			w[i].wr.rdma.rkey = m1->rkey;
		}
		int ok = ibv_post_send(p.a, &w[0], &b) == 0;
		for (int i = 0; ok && i < 40; i++)
			ok = wait_wc(p.cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)(500 + i);
		ok = ok && !memcmp(buf[1] + 20000, buf[0] + 20000, 8 * 40);
		CHECK(ok, "a chain of 40 WRITEs: 40 completions in order, data placed");
		memset(buf[1] + 20000, 0, 8 * 40);
		w[19].next = NULL;
		w[18].opcode = (enum ibv_wr_opcode)0x7f;
		int rc = ibv_post_send(p.a, &w[0], &b);
		ok = rc == EINVAL && b == &w[18];
		for (int i = 0; ok && i < 18; i++)
			ok = wait_wc(p.cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)(500 + i);
		ok = ok && ibv_poll_cq(p.cq, 1, &wc) == 0 && !memcmp(buf[1] + 20000, buf[0] + 20000, 8 * 18);
		uint64_t zero[2] = { 0, 0 };
		ok = ok && !memcmp(buf[1] + 20000 + 8 * 18, zero, 16);
		CHECK(ok, "a chain with a bad 19th WR: EINVAL, bad_wr names it, the 18 before it done (rc %d)", rc);
	}
	CHECK(post(p.a, IBV_WR_RDMA_WRITE, m0, 0, 8, (uintptr_t)buf[1], m1->rkey ^ 0x5500, m0->lkey) == 0 &&
		      wait_wc(p.cq, &wc) == 1 && wc.status == IBV_WC_REM_ACCESS_ERR,
	      "WRITE with a wrong rkey: IBV_WC_REM_ACCESS_ERR (%s)", ibv_wc_status_str(wc.status));
	destroy_pair(&p);
	CHECK(connect_pair(&p) == 0, "a fresh pair");
	CHECK(post(p.a, IBV_WR_RDMA_WRITE, m0, 0, 8, (uintptr_t)buf[1], m1->rkey, m0->lkey ^ 0x5500) == 0 &&
		      wait_wc(p.cq, &wc) == 1 && wc.status == IBV_WC_LOC_PROT_ERR,
	      "WRITE with a wrong lkey: IBV_WC_LOC_PROT_ERR (%s)", ibv_wc_status_str(wc.status));
	destroy_pair(&p);

	ud_uc_checks(m0, m1, buf[0], buf[1]);

	/* Completion events. */
	{
		struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
		struct ibv_cq *ecq = ch ? ibv_create_cq(ctx, 64, (void *)0x1234, ch, 0) : NULL;
		struct ibv_qp *qa2 = ecq ? rc_qp(ecq) : NULL, *qb2 = ecq ? rc_qp(ecq) : NULL;
		int ok = qa2 && qb2 && !to_init(qa2) && !to_init(qb2) && !to_rtr(qa2, qb2->qp_num, 9) &&
			 !to_rtr(qb2, qa2->qp_num, 8) && !to_rts(qa2, 8) && !to_rts(qb2, 9);
		struct pollfd pf = { .fd = ch ? ch->fd : -1, .events = POLLIN };
		ok = ok && ibv_req_notify_cq(ecq, 0) == 0 &&
		     post(qa2, IBV_WR_RDMA_WRITE, m0, 0, 8, (uintptr_t)buf[1], m1->rkey, m0->lkey) == 0 &&
		     poll(&pf, 1, 5000) == 1;
		struct ibv_cq *ev_cq = NULL;
		void *ev_ctx = NULL;
		ok = ok && ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0 && ev_cq == ecq && ev_ctx == (void *)0x1234;
		if (ok)
			ibv_ack_cq_events(ev_cq, 1);
		ok = ok && ibv_poll_cq(ecq, 1, &wc) == 1 && wc.status == IBV_WC_SUCCESS;
		CHECK(ok, "completion channel: poll() wakes, get_cq_event names the CQ and its context");
		/* A program's signal with a handler (no SA_RESTART) ends the wait with
		 * -1/EINTR, as rdma-core's read(2) of the channel's fd: qperf's
		 * SIGALRM ends its latency test so. */
		{
			struct sigaction sa = { .sa_handler = on_alarm }, old;
			sigemptyset(&sa.sa_mask);
			struct itimerval it = { .it_value = { .tv_usec = 100000 } }, off = { 0 };
			int got = -2, err = 0;
			if (ch && sigaction(SIGALRM, &sa, &old) == 0) {
				alarms = 0;
				setitimer(ITIMER_REAL, &it, NULL);
				got = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
				err = errno;
				setitimer(ITIMER_REAL, &off, NULL);
				sigaction(SIGALRM, &old, NULL);
			}
			CHECK(got == -1 && err == EINTR && alarms == 1,
			      "get_cq_event interrupted by the program's SIGALRM: -1/EINTR (got %d, errno %d, %d alarms)",
			      got, err, (int)alarms);
		}
		CHECK(!ch || ibv_destroy_comp_channel(ch) == EBUSY,
		      "destroy_comp_channel with a CQ: EBUSY (the errno value, as rdma-core's verbs.c)");
		if (qa2)
			ibv_destroy_qp(qa2);
		if (qb2)
			ibv_destroy_qp(qb2);
		if (ecq)
			ibv_destroy_cq(ecq);
		CHECK(ch && ibv_destroy_comp_channel(ch) == 0, "destroy_comp_channel");
	}

	/* Solicited-only notification (ibv_req_notify_cq(3), IBA 11.4.2.2): the
	 * receiver's CQ, armed with solicited_only=1, gets its event for a
	 * message sent with IBV_SEND_SOLICITED (BTH SE) or a completion in
	 * error, not for a plain SEND, nor for the sender's completions. */
	{
		struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
		struct ibv_cq *rcq = ch ? ibv_create_cq(ctx, 64, (void *)0x5e, ch, 0) : NULL;
		struct ibv_cq *scq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
		struct ibv_qp *qs = rc_qp(scq), *qr = rcq && scq ? rc_qp2(scq, rcq) : NULL;
		int ok = qs && qr && !to_init(qs) && !to_init(qr) && !to_rtr(qs, qr->qp_num, 30) &&
			 !to_rtr(qr, qs->qp_num, 40) && !to_rts(qs, 40) && !to_rts(qr, 30);
		CHECK(ok, "solicited: a pair whose receiver completes into a CQ with a channel");
		struct pollfd pf = { .fd = ch ? ch->fd : -1, .events = POLLIN };
		struct ibv_cq *ev_cq = NULL;
		void *ev_ctx = NULL;
		/* recv: post one receive of `len` bytes; send: one SEND of 19 bytes. */
#define RECV(id, len)                                                                                         \
	do {                                                                                                  \
		struct ibv_sge rs = { .addr = (uintptr_t)buf[1] + 8192, .length = (len), .lkey = m1->lkey };   \
		struct ibv_recv_wr r = { .wr_id = (id), .sg_list = &rs, .num_sge = 1 }, *rb;                  \
		ok = ok && ibv_post_recv(qr, &r, &rb) == 0;                                                   \
	} while (0)
#define SEND(id, flags)                                                                                       \
	do {                                                                                                  \
		struct ibv_sge ss = { .addr = (uintptr_t)buf[0], .length = 19, .lkey = m0->lkey };             \
		struct ibv_send_wr s = { .wr_id = (id), .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND, \
					 .send_flags = IBV_SEND_SIGNALED | (flags) }, *sb;                     \
		ok = ok && ibv_post_send(qs, &s, &sb) == 0 && wait_wc(scq, &wc) == 1 && wc.wr_id == (id);     \
	} while (0)
		/* The sender's completion comes after the receiver's ACK, so the
		 * receive completion is in rcq when the 300 ms wait starts. */
		RECV(1, 64);
		ok = ok && ibv_req_notify_cq(rcq, 1) == 0;
		SEND(11, 0);
		int quiet = ok && poll(&pf, 1, 300) == 0;
		ok = ok && ibv_poll_cq(rcq, 1, &wc) == 1 && wc.wr_id == 1 && wc.status == IBV_WC_SUCCESS;
		CHECK(ok && quiet, "solicited_only: a SEND without SOLICITED completes without an event");
		RECV(2, 64);
		SEND(12, IBV_SEND_SOLICITED);
		ok = ok && poll(&pf, 1, 5000) == 1 && ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0 && ev_cq == rcq &&
		     ev_ctx == (void *)0x5e;
		if (ev_cq)
			ibv_ack_cq_events(ev_cq, 1);
		ok = ok && ibv_poll_cq(rcq, 2, &wc) == 1 && wc.wr_id == 2 && wc.status == IBV_WC_SUCCESS;
		CHECK(ok, "solicited_only: a SEND with SOLICITED (BTH SE) wakes the channel");
		/* A receive too short for the message: IBV_WC_LOC_LEN_ERR, solicited
		 * whatever the SE bit (the QPs end in ERR; the last check here). */
		RECV(3, 4);
		ok = ok && ibv_req_notify_cq(rcq, 1) == 0;
		{
			struct ibv_sge ss = { .addr = (uintptr_t)buf[0], .length = 19, .lkey = m0->lkey };
			struct ibv_send_wr s = { .wr_id = 13, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
						 .send_flags = IBV_SEND_SIGNALED }, *sb;
			ok = ok && ibv_post_send(qs, &s, &sb) == 0;
		}
		ev_cq = NULL;
		ok = ok && poll(&pf, 1, 5000) == 1 && ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0 && ev_cq == rcq;
		if (ev_cq)
			ibv_ack_cq_events(ev_cq, 1);
		ok = ok && ibv_poll_cq(rcq, 1, &wc) == 1 && wc.wr_id == 3 && wc.status != IBV_WC_SUCCESS;
		CHECK(ok, "solicited_only: an unsolicited receive in error (%s) wakes the channel",
		      ibv_wc_status_str(wc.status));
#undef RECV
#undef SEND
		while (ibv_poll_cq(scq, 1, &wc) == 1)
			;
		if (qs)
			ibv_destroy_qp(qs);
		if (qr)
			ibv_destroy_qp(qr);
		if (rcq)
			ibv_destroy_cq(rcq);
		if (scq)
			ibv_destroy_cq(scq);
		if (ch)
			ibv_destroy_comp_channel(ch);
	}

	/* The async event descriptor (ibv_get_async_event(3)): readable once an
	 * event is queued; with O_NONBLOCK, -1/EAGAIN when none is. A CQ of 2
	 * entries given 8 completions raises IBV_EVENT_CQ_ERR. */
	{
		int fl = fcntl(ctx->async_fd, F_GETFL);
		struct pollfd apf = { .fd = ctx->async_fd, .events = POLLIN };
		struct ibv_async_event ae;
		int ok = fl >= 0 && fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK) == 0;
		/* Whatever the checks above left (events of QPs destroyed since are
		 * not reported: their ibv_qp is gone). */
		for (int i = 0; ok && i < 100 && ibv_get_async_event(ctx, &ae) == 0; i++)
			ibv_ack_async_event(&ae);
		errno = 0;
		CHECK(ok && poll(&apf, 1, 0) == 0 && ibv_get_async_event(ctx, &ae) == -1 && errno == EAGAIN,
		      "async_fd: not readable, and get_async_event -1/EAGAIN (O_NONBLOCK), with no event queued");
		struct ibv_cq *small = ibv_create_cq(ctx, 2, NULL, NULL, 0), *other = ibv_create_cq(ctx, 64, NULL, NULL, 0);
		struct ibv_qp *q1 = small ? rc_qp(small) : NULL, *q2 = other ? rc_qp(other) : NULL;
		ok = ok && q1 && q2 && !to_init(q1) && !to_init(q2) && !to_rtr(q1, q2->qp_num, 50) &&
		     !to_rtr(q2, q1->qp_num, 60) && !to_rts(q1, 60) && !to_rts(q2, 50);
		for (int i = 0; ok && i < 8; i++)
			ok = post(q1, IBV_WR_RDMA_WRITE, m0, 0, 8, (uintptr_t)buf[1], m1->rkey, m0->lkey) == 0;
		int readable = ok && poll(&apf, 1, 5000) == 1;
		ok = readable && ibv_get_async_event(ctx, &ae) == 0 && ae.event_type == IBV_EVENT_CQ_ERR &&
		     ae.element.cq == small;
		if (ok)
			ibv_ack_async_event(&ae);
		CHECK(ok, "async_fd: readable once an event is queued (readable %d); get_async_event: CQ_ERR of the full CQ",
		      readable);
		errno = 0;
		CHECK(poll(&apf, 1, 0) == 0 && ibv_get_async_event(ctx, &ae) == -1 && errno == EAGAIN,
		      "async_fd: not readable again once the event was taken");
		for (int i = 0; i < 8 && wait_wc(small, &wc) == 1; i++)
			;
		if (q1)
			ibv_destroy_qp(q1);
		if (q2)
			ibv_destroy_qp(q2);
		if (small)
			ibv_destroy_cq(small);
		if (other)
			ibv_destroy_cq(other);
		/* Draining may have overrun the CQ again: leave no event behind. */
		while (ibv_get_async_event(ctx, &ae) == 0)
			ibv_ack_async_event(&ae);
		if (fl >= 0)
			fcntl(ctx->async_fd, F_SETFL, fl);
	}

	/* Create/destroy cycles of every object: memory stays flat. */
	long before = 0;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int bad_cycle = 0;
	for (long i = 0; i < cycles && !bad_cycle; i++) {
		if (i == cycles / 10)
			before = rss_kib();
		struct ibv_pd *p2 = ibv_alloc_pd(ctx);
		struct ibv_mr *m = p2 ? ibv_reg_mr(p2, buf[0], 4096, IBV_ACCESS_LOCAL_WRITE) : NULL;
		struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
		struct ibv_cq *c = ch ? ibv_create_cq(ctx, 8, NULL, ch, 0) : NULL;
		struct ibv_qp_init_attr qi = { .send_cq = c, .recv_cq = c, .qp_type = IBV_QPT_RC,
					       .cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
		struct ibv_qp *q = c && p2 ? ibv_create_qp(p2, &qi) : NULL;
		if (!p2 || !m || !ch || !c || !q) {
			printf("cycle %ld: create failed (errno %d)\n", i, errno);
			bad_cycle = 1;
		}
		if ((q && ibv_destroy_qp(q)) || (c && ibv_destroy_cq(c)) || (ch && ibv_destroy_comp_channel(ch)) ||
		    (m && ibv_dereg_mr(m)) || (p2 && ibv_dealloc_pd(p2))) {
			printf("cycle %ld: destroy failed\n", i);
			bad_cycle = 1;
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	long after = rss_kib();
	double secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
	CHECK(!bad_cycle && after - before < 4096,
	      "%ld cycles of PD+MR+channel+CQ+QP create/destroy in %.1f s: RSS %ld -> %ld KiB (growth < 4 MiB after the first tenth)",
	      cycles, secs, before, after);

	CHECK(ibv_dereg_mr(m0) == 0 && ibv_dereg_mr(m1) == 0 && ibv_destroy_cq(cq) == 0 && ibv_dealloc_pd(pd) == 0,
	      "tear down");
	CHECK(ibv_close_device(ctx) == 0, "close_device");
	printf("verbs_check: %s (%d failed)\n", failures ? "FAILED" : "all passed", failures);
	return failures ? 1 : 0;
}
